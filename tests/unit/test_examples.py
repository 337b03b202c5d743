"""Every spec under examples/ is one respawn accepts, and the files its command names are in the code it is
submitted with (`respawn submit examples/X/spec.yaml --workdir .`: the repository, packed as the CLI packs it)."""

from __future__ import annotations

import io
import re
import shlex
import tarfile
from pathlib import Path

import pytest
import yaml

from controller.cli import pack
from controller.core import sweep
from controller.core.spec import parse_spec
from controller.service.config import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
FILES = sorted(p for p in EXAMPLES.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))
SWEEPS = [p for p in FILES if "base" in (yaml.safe_load(p.read_bytes()) or {})]  # respawn sweep submit's files
SPECS = [p for p in FILES if p not in SWEEPS]
PACKED_FROM_THE_REPO = ("hf-finetune", "lightning")  # their spec says: --workdir . from the repository's root


def test_the_examples_folder_holds_every_spec_this_test_knows_of():
    names = {p.relative_to(EXAMPLES).as_posix() for p in SPECS}
    assert {"llm-finetune.yaml", "hf-finetune/spec.yaml", "lightning/spec.yaml"} <= names


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_example_spec_parses_under_its_own_name(path: Path):
    raw = path.read_bytes()
    doc = yaml.safe_load(raw)
    declared = doc.get("name")
    job = declared or path.stem
    if path.name.startswith("spec."):
        assert declared == path.parent.name, "a spec in its own folder is named after it"
    if (code := doc.get("code")) and "://" not in code:  # a local path: what respawn submit packs, beside the spec
        assert (path.parent / code).exists(), code
        raw = yaml.safe_dump({**doc, "code": "gs://respawn-local/code/" + "0" * 64 + ".tar.gz"}).encode()
    spec = parse_spec(raw, job)
    assert spec.zones and (spec.command or spec.image)
    assert spec.checkpoint is not None and spec.checkpoint.uri.startswith("gs://")


def test_the_examples_folder_holds_a_container_job_beside_the_plain_ones():
    images = [p.name for p in SPECS if yaml.safe_load(p.read_bytes()).get("image")]
    assert images == ["container.yaml"]  # each parses (above): an image respawn takes


def test_the_examples_folder_holds_a_sweep():
    assert [p.name for p in SWEEPS] == ["sweep.yaml"]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_every_example_sweep_makes_trials_respawn_accepts(path: Path):
    sw = sweep.parse_sweep(path.read_bytes(), path.name)
    assert isinstance(sw.base, dict) and sw.metric is not None
    assert (path.parent / sw.base["code"]).is_file()  # what respawn sweep submit packs, beside the file
    base = {**sw.base, "code": "gs://respawn-local/code/" + "0" * 64 + ".tar.gz"}  # as it submits it once packed
    trials = sweep.trials(sw)
    for trial in trials:
        spec = parse_spec(yaml.safe_dump(sweep.trial_spec(base, sw, trial)), trial.job)
        assert spec.sweep is not None and spec.checkpoint is not None and spec.checkpoint.uri.endswith(trial.job)
    assert len(trials) > sw.max_parallel  # some wait: the example shows the limit at work


@pytest.fixture(scope="module")
def repo_members() -> set[str]:
    packed = pack.pack(REPO_ROOT)
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        return {m.name.removeprefix("./") for m in tar.getmembers()}


@pytest.mark.parametrize("example", PACKED_FROM_THE_REPO)
def test_the_files_a_kit_example_runs_are_in_the_packed_repository(example: str, repo_members: set[str]):
    spec = parse_spec((EXAMPLES / example / "spec.yaml").read_bytes(), example)
    assert spec.code is None, "the code comes from --workdir, not the spec"
    words = shlex.split(spec.command if isinstance(spec.command, str) else " ".join(spec.command))
    named = [w for w in words if re.fullmatch(r"(\./)?(examples|respawnkit)(/\S*)?", w)]
    assert f"examples/{example}/train.py" in named and f"examples/{example}/requirements.txt" in named
    assert "./respawnkit" in named and "respawnkit/pyproject.toml" in repo_members
    for word in named:
        path = word.removeprefix("./")
        assert path in repo_members or any(m.startswith(path.rstrip("/") + "/") for m in repo_members), word


def test_the_examples_folder_holds_a_single_host_and_a_multi_host_tpu7x_slice_on_compute_engine():
    found = {}
    for path in SPECS:
        doc = yaml.safe_load(path.read_bytes())
        if (doc.get("tpu") or {}).get("machine_type") == "tpu7x-standard-4t":
            raw = yaml.safe_dump({**doc, "code": "gs://respawn-local/code/" + "0" * 64 + ".tar.gz"}).encode()
            tpu = parse_spec(raw, doc["name"]).tpu
            assert tpu is not None and tpu.api == "compute"
            found[path.name] = tpu.hosts
    assert found == {"tpu7x-single.yaml": 1, "tpu7x-slice.yaml": 2}
