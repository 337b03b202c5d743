PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test unit demo chaos fuzz bench sim install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml requirements.txt
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

demo: $(STAMP)
	$(BIN)/respawn demo

# Proofs: seeded randomized runs of the real engine over faulty fakes, and hostile inputs.
# A failing seed prints the one command that replays it. `make test` runs a sample of each.
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos --runs 1000

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --specs 10000

# Figures, not tests: the scenarios of bench/__main__.py, written to bench/results.json.
bench: $(STAMP)
	$(BIN)/python -m bench --local 1430

# Figures, not tests: a week of a Spot fleet under respawn and the baselines, on the same traces
# (sim/), written to sim/results.json and sim/results.png. About two minutes on 2 cores.
sim: $(STAMP)
	$(BIN)/python -m sim

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
