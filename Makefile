PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-latest test-frameworks test-browser test-containers unit demo chaos fuzz bench sim install lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Installs exactly the lock, every file checked against its hash, then the package itself
# (no dependencies of its own: they are all in the lock, which pip check confirms).
$(STAMP): $(BIN)/python pyproject.toml requirements-dev.txt
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

# The locks: requirements-dev.txt (tests, demo, CLI) from pyproject.toml's [dev] extras, and
# requirements.txt (what the deployed functions install) from requirements.in, held to the
# same versions. Universal: one lock for Linux, macOS and Windows, Python 3.11 and later.
# UPGRADE= keeps every pin that still fits (after editing a range);
# UPGRADE='--upgrade-package NAME' moves one package.
UPGRADE ?= --upgrade
LOCK := --universal --python-version 3.11 --generate-hashes --quiet
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml requirements-dev.in --extra dev $(UPGRADE) $(LOCK) -o requirements-dev.txt
	$(BIN)/uv pip compile requirements.in --constraint requirements-dev.txt $(LOCK) -o requirements.txt

# The suite against the newest release of everything pyproject.toml allows, in its own
# venv, leaving the locks alone: an upstream change shows up here before `make lock` takes it.
LATEST := .venv-latest
test-latest:
	[ -x $(LATEST)/bin/python ] || $(PYTHON) -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	$(LATEST)/bin/python -m pip list --format=freeze > $(LATEST)/versions.txt
	$(LATEST)/bin/python -m pytest

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/respawn demo
	@echo "respawn is installed in $(VENV): 'source $(VENV)/bin/activate' puts it on your PATH (or run $(BIN)/respawn)"

# Proofs: seeded randomized runs of the real engine over faulty fakes, and hostile inputs.
# A failing seed prints the one command that replays it. `make test` runs a sample of each.
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos --runs 1000

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --specs 10000

# Figures, not tests: every scenario of bench/__main__.py (SCENARIOS) in one run, written once to
# bench/results.json with the commit, a dirty flag, the start time, the seeds, the machine and each
# scenario's wall time. One scenario again: python -m bench --only NAME, into bench/runs/.
bench: $(STAMP)
	$(BIN)/python -m bench

# Figures, not tests: a week of a Spot fleet under respawn and the baselines, on the same traces
# (sim/): the headline with advice as Google gives it, the oracle section, the ceiling and the
# sweep, written to sim/results.json and sim/results.png. About 40 minutes on 2 cores.
sim: $(STAMP)
	$(BIN)/python -m sim --sweep

# respawnkit's hooks in real framework runs (tests/frameworks: a run SIGTERMed mid-way resumes with 0 steps
# lost and the same losses as an uninterrupted one), on CPU with tiny models built from config. The frameworks
# are not in the locks, nor collected by `make test`: their pins go into the project's venv here (torch 2.13.0
# is the CPU wheel where one is provided, as on this project's machines), and JAX's, which pin a protobuf the
# Google clients cannot take, into a folder of their own that only the JAX trainer's path holds.
FRAMEWORKS := torch==2.13.0 transformers==5.18.0 accelerate==1.15.0 lightning==2.6.6
JAX := jax==0.10.2 jaxlib==0.10.2 orbax-checkpoint==0.12.8
JAX_SITE := $(VENV)/jax-site
# Each integration (plain torch, Lightning, HF, JAX/Orbax) preempted with notice, SIGKILLed mid-upload, and SIGTERMed
# with too short a notice for its save; `pip check` confirms the framework pins sit with the lock's (the JAX folder
# is outside the venv's site-packages, so pip check does not see it: its import is the test of it).
test-frameworks: $(STAMP)
	$(BIN)/python -m pip install --quiet $(FRAMEWORKS)
	$(BIN)/python -m pip check
	[ -d $(JAX_SITE)/orbax ] || $(BIN)/python -m pip install --quiet --target $(JAX_SITE) $(JAX)
	RESPAWN_FRAMEWORKS=1 RESPAWN_JAX_SITE=$(abspath $(JAX_SITE)) $(BIN)/python -m pytest tests/frameworks

# The dashboard in a real browser (tests/browser): Debian's headless Chromium, installed with apt when it is
# missing (as root), driven by Playwright for Python, whose pin goes into the venv. Never `playwright install`: it
# downloads a browser of its own; the tests launch $(CHROMIUM). Not collected by `make test`. Without a Chromium
# (not root, no Debian archive) the tests run anyway and fail saying why.
BROWSER := playwright==1.65.2 greenlet==3.5.6
CHROMIUM ?= /usr/bin/chromium
test-browser: $(STAMP)
	[ -x $(CHROMIUM) ] || { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends chromium; } || echo "could not install chromium: see the tests' failure"
	$(BIN)/python -m pip install --quiet $(BROWSER)
	$(BIN)/python -m pip check
	RESPAWN_BROWSER=1 RESPAWN_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest tests/browser

# Container images with a real runtime (tests/containers): Debian's podman (runc as its runtime, catatonit for its
# init) pulling from the local Artifact Registry what it serves, made from a static busybox; installed with apt when
# missing (as root). Not collected by `make test`. Without them (not root, no Debian archive) the tests run anyway
# and fail saying why.
CONTAINER_PACKAGES := podman runc catatonit busybox-static
test-containers: $(STAMP)
	command -v podman > /dev/null && command -v runc > /dev/null && command -v catatonit > /dev/null \
		&& ldd /bin/busybox 2>&1 | grep -q 'not a dynamic executable' \
		|| { [ "$$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends $(CONTAINER_PACKAGES); } \
		|| echo "could not install $(CONTAINER_PACKAGES): see the tests' failure"
	RESPAWN_CONTAINERS=1 $(BIN)/python -m pytest tests/containers

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

clean:
	rm -rf $(VENV) $(LATEST) *.egg-info .pytest_cache
