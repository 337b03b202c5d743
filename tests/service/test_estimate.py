"""respawn submit's pre-launch estimate, code from a local folder, and respawn run: over the
in-memory store, compute, capacity advice and quotas (controller/cli/estimate.py, pack.py,
submitting.py)."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller.adapters.memory import MemoryAdvisor, MemoryQuotas
from controller.cli import estimate, submitting
from controller.cli.main import app
from controller.core import errors, names
from controller.core.spec import parse_spec
from controller.service import bootstrap
from controller.service.config import Settings
from tests.harness import BUCKET, PROJECT, TRAINER, Harness, spec_doc
from tests.contract.test_ports import request_for

runner = CliRunner()
ZONES = ["us-central1-a", "us-central1-b"]


class World:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.advisor = MemoryAdvisor(h.compute)
        self.quotas = MemoryQuotas(h.compute)
        self.broken: dict[str, str] = {}  # a source that cannot even be built: its reason

    def sources(self) -> estimate.Sources:
        def built(key: str, thing: Any) -> Any:
            if key in self.broken:
                raise RuntimeError(self.broken[key])
            return thing

        return estimate.sources(lambda: built("advice", self.advisor), lambda: built("quotas", self.quotas))

    def spec(self, job: str) -> dict[str, Any] | None:
        if not self.h.store.exists(BUCKET, names.spec_key(job)):
            return None
        return yaml.safe_load(self.h.store.read(BUCKET, names.spec_key(job)).data)

    def code_objects(self) -> list[str]:
        return [i.name for i in self.h.store.list(BUCKET, "code/")]


@pytest.fixture
def world(monkeypatch) -> World:
    monkeypatch.setenv("COLUMNS", "400")
    h = Harness()
    w = World(h)
    bootstrap.override(None, Settings(bucket=BUCKET, project=PROJECT, trainer_service_account=TRAINER),
                       h.store, h.compute)
    monkeypatch.setattr(submitting, "google_sources", lambda config: w.sources)
    monkeypatch.setattr(submitting, "interactive", lambda: False)
    return w


def write_spec(tmp_path, **overrides: Any) -> str:
    path = tmp_path / "j.yaml"
    path.write_text(yaml.safe_dump(spec_doc(**{"zones": ZONES, **overrides})))
    return str(path)


def row(output: str, zone: str, model: str) -> list[str]:
    """One row of the estimate table as its cells."""
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]", line) if c.strip()]
        if cells[:2] == [zone, model]:
            return cells
    raise AssertionError(f"no row for {zone} {model} in:\n{output}")


# -- the table -------------------------------------------------------------------------------

def test_each_zone_and_model_is_priced_for_the_whole_job_saying_where_the_price_came_from(world, tmp_path):
    world.advisor.spot_prices["g2-standard-8"] = 0.30  # capacityHistory's Spot list price per VM-hour
    path = write_spec(tmp_path, nodes=2, provisioning=["spot", "standard"])
    result = runner.invoke(app, ["submit", path, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "estimate for j: 2 × g2-standard-8, 1 nvidia-l4 each" in result.output
    assert row(result.output, "us-central1-a", "spot")[2:4] == ["$0.60", "capacity history"]
    assert row(result.output, "us-central1-b", "standard")[2:4] == ["$1.42", "respawn's table"]  # 2 x 0.71
    world.advisor.spot_prices.clear()
    table = runner.invoke(app, ["submit", path, "--dry-run"]).output
    assert row(table, "us-central1-a", "spot")[2:4] == ["$0.44", "respawn's table"]  # 2 x 0.22


def test_policy_prices_win_and_flex_start_says_it_is_priced_as_on_demand(world, tmp_path):
    path = write_spec(tmp_path, provisioning=["spot", "flex-start"],
                      policy={"prices": {"spot": 1.5}, "max_run_duration": "4h"})
    result = runner.invoke(app, ["submit", path, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert row(result.output, "us-central1-a", "spot")[2:4] == ["$1.50", "policy.prices"]
    assert row(result.output, "us-central1-a", "flex-start")[2:4] == ["$0.71", "respawn's table (as on-demand)"]


def test_obtainability_and_the_gpu_quota_left_against_what_the_job_needs(world, tmp_path):
    world.h.compute.stockouts.add("us-central1-b")
    world.quotas.limits["us-central1"] = {"PREEMPTIBLE_NVIDIA_L4_GPUS": 4, "NVIDIA_L4_GPUS": 2}
    other = dataclasses.replace(request_for("other", zone="us-central1-a"), project=PROJECT)
    world.h.compute.insert([other], "5d1c1c5e-0000-4000-8000-00000000000a")
    path = write_spec(tmp_path, nodes=3, provisioning=["spot", "standard"])
    result = runner.invoke(app, ["submit", path, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "GPU quota left (needs 3)" in result.output
    spot_a, spot_b = row(result.output, "us-central1-a", "spot"), row(result.output, "us-central1-b", "spot")
    assert spot_a[4] == "0.90" and spot_b[4] == "0.00"
    assert spot_a[5] == "3 of 4"  # another job's Spot VM holds one
    assert row(result.output, "us-central1-a", "standard")[5] == "2 of 2 short"
    assert "quota: spot PREEMPTIBLE_NVIDIA_L4_GPUS, standard NVIDIA_L4_GPUS" in result.output


def test_rows_come_in_the_order_placement_tries_them_with_the_goodput_it_weighed(world, tmp_path):
    """Issue 36: what the estimate shows is what placement uses: b's three times longer Spot
    uptime puts it first, and its expected goodput is the figure it was ranked by."""
    from controller.core import placement

    world.advisor.spot_uptime("us-central1-a", 3600.0)
    world.advisor.spot_uptime("us-central1-b", 3 * 3600.0)
    path = write_spec(tmp_path, provisioning=["spot", "standard"])  # capacity placement: Spot's default
    output = runner.invoke(app, ["submit", path, "--dry-run"]).output
    order = [(z, m) for line in output.splitlines()
             for z in ZONES for m in ("spot", "standard")
             if [c.strip() for c in re.split(r"[│┃]", line) if c.strip()][:2] == [z, m]]
    assert order == [("us-central1-b", "spot"), ("us-central1-a", "spot"),
                     ("us-central1-a", "standard"), ("us-central1-b", "standard")]
    spec = parse_spec(yaml.safe_dump(spec_doc(zones=ZONES, provisioning=["spot", "standard"])), "j")
    advice = {z: world.advisor.advise(s)[z] for s in placement.shapes(spec, "spot", PROJECT) for z in s.zones}
    weighed = placement.worths(spec, "spot", advice)
    assert row(output, "us-central1-b", "spot")[-1] == f"{weighed['us-central1-b'].goodput:.0%}"
    assert row(output, "us-central1-a", "standard")[-1] == "—"  # standard: placement kept the spec's order
    assert "est. goodput: weighed only under placement: capacity" in output


def test_a_spot_zone_without_an_estimated_uptime_shows_no_goodput_and_says_why(world, tmp_path):
    world.advisor.spot_estimates = False  # obtainability only: Google's uptime is best effort
    output = runner.invoke(app, ["submit", write_spec(tmp_path), "--dry-run"]).output
    assert row(output, "us-central1-a", "spot")[-1] == "—" and "100%" not in output
    assert "for Spot, only where the advice gave an estimated uptime" in output


def test_a_source_that_fails_shows_a_dash_says_why_and_never_blocks_the_submit(world, tmp_path):
    world.advisor.failure = errors.RequestError("403 Compute Engine API has not been used in project")
    world.broken["quotas"] = "no credentials"
    result = runner.invoke(app, ["submit", write_spec(tmp_path)])
    assert result.exit_code == 0, result.output
    cells = row(result.output, "us-central1-a", "spot")
    assert cells[2:] == ["$0.22", "respawn's table", "—", "—", "—"]
    assert "capacity advice failed: 403 Compute Engine API has not been used" in result.output
    assert "regions.get unavailable (no credentials)" in result.output
    assert world.spec("j") is not None and "submitted j" in result.output


def test_a_tpu_job_has_no_compute_advice_or_quota_and_says_so(world, tmp_path):
    path = write_spec(tmp_path, machine_type=None, tpu={"type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"})
    result = runner.invoke(app, ["submit", path, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "1 TPU node v5litepod-8 (8 chips)" in result.output
    assert row(result.output, "us-central1-a", "spot")[2:] == ["$3.84", "respawn's table", "—", "—", "—"]
    assert "capacity advice does not cover Cloud TPU" in result.output and "regions.get" in result.output
    assert world.advisor.calls == [] and world.quotas.calls == []


def test_a_tpu7x_slice_in_compute_engine_says_it_has_no_known_price_and_no_capacity_advice(world, tmp_path):
    path = write_spec(tmp_path, machine_type=None, zones=["us-central1-c"],
                      tpu={"machine_type": "tpu7x-standard-4t", "topology": "2x2x2"})
    result = runner.invoke(app, ["submit", path, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "1 TPU slice of 2 hosts tpu7x-standard-4t (8 chips)" in result.output
    assert row(result.output, "us-central1-c", "spot")[2] == "—" and "set policy.prices" in result.output
    assert "capacity advice does not cover" in result.output
    assert world.advisor.calls == [] and world.quotas.calls == []


def test_a_v6e_slice_in_compute_engine_is_priced_by_its_chips(world, tmp_path):
    path = write_spec(tmp_path, machine_type=None, zones=["us-central1-b"],
                      tpu={"machine_type": "ct6e-standard-4t", "topology": "4x4"})
    result = runner.invoke(app, ["submit", path, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "1 TPU slice of 4 hosts ct6e-standard-4t (16 chips)" in result.output
    assert row(result.output, "us-central1-b", "spot")[2:4] == ["$15.20", "respawn's table"]  # 16 x $0.95


def test_run_takes_a_tpu_machine_type_and_its_topology(world):
    result = runner.invoke(app, ["run", "-n", "iron", "-z", "us-central1-c", "--tpu", "tpu7x-standard-4t",
                                 "--tpu-topology", "2x2x2", "--dry-run", "--", "python train.py"])
    assert result.exit_code == 0, result.output
    assert "machine_type: tpu7x-standard-4t" in result.output and "topology: 2x2x2" in result.output
    result = runner.invoke(app, ["run", "-n", "iron", "-z", "us-central1-c", "--tpu", "tpu7x-8",
                                 "--tpu-runtime", "x", "--", "python train.py"])
    assert result.exit_code == 2 and "tpu7x-standard-4t" in result.output, result.output


# -- the question ----------------------------------------------------------------------------

def test_on_a_terminal_it_asks_and_a_no_uploads_nothing(world, tmp_path, monkeypatch):
    monkeypatch.setattr(submitting, "interactive", lambda: True)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    path = write_spec(tmp_path, code="src")
    declined = runner.invoke(app, ["submit", path], input="n\n")
    assert declined.exit_code == 1 and "Submit j?" in declined.output and "not submitted" in declined.output
    assert world.spec("j") is None and world.code_objects() == []
    accepted = runner.invoke(app, ["submit", path], input="y\n")
    assert accepted.exit_code == 0 and "Submit j?" in accepted.output, accepted.output
    assert world.spec("j") is not None and len(world.code_objects()) == 1


def test_yes_skips_the_question_and_no_terminal_is_never_asked(world, tmp_path, monkeypatch):
    path = write_spec(tmp_path)
    piped = runner.invoke(app, ["submit", path])  # stdin is not a terminal here
    assert piped.exit_code == 0 and "Submit j?" not in piped.output and "estimate for j" in piped.output
    monkeypatch.setattr(submitting, "interactive", lambda: True)
    told = runner.invoke(app, ["submit", path, "--replace", "--yes"])
    assert told.exit_code == 0 and "Submit j?" not in told.output, told.output


def test_dry_run_shows_the_table_and_uploads_neither_spec_nor_code(world, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    result = runner.invoke(app, ["submit", write_spec(tmp_path, code="./src"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "estimate for j" in result.output and "dry run: nothing uploaded" in result.output
    assert re.search(r"gs://respawn-test/code/[0-9a-f]{64}\.tar\.gz \(1 file, .*; to upload\)", result.output)
    assert world.spec("j") is None and world.code_objects() == []


def test_a_spec_refused_by_the_policy_shows_no_estimate_and_uploads_nothing(world, tmp_path):
    result = runner.invoke(app, ["submit", write_spec(tmp_path, nodes=100_000)])
    assert result.exit_code == 2 and "nodes" in result.output and "estimate" not in result.output
    assert world.code_objects() == [] and world.spec("j") is None


# -- code from a local folder ------------------------------------------------------------------

def test_a_local_code_folder_is_uploaded_content_addressed_and_not_again_when_unchanged(world, tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "pkg" / "big.ckpt").write_text("weights")
    (src / ".respawnignore").write_text("*.ckpt\n")
    path = write_spec(tmp_path, code="src")  # relative to the spec's folder, not the current one
    first = runner.invoke(app, ["submit", path])
    assert first.exit_code == 0, first.output
    [code] = world.code_objects()
    assert re.fullmatch(r"code/[0-9a-f]{64}\.tar\.gz", code)
    stored = world.spec("j")
    assert stored["code"] == f"gs://{BUCKET}/{code}"
    assert parse_spec(world.h.store.read(BUCKET, names.spec_key("j")).data, "j").code == stored["code"]
    generation = world.h.store.stat(BUCKET, code).generation
    again = runner.invoke(app, ["submit", path, "--replace"])
    assert again.exit_code == 0 and "already in the bucket" in again.output, again.output
    assert world.h.store.stat(BUCKET, code).generation == generation and world.code_objects() == [code]
    (src / "train.py").write_text("print('changed')\n")
    assert runner.invoke(app, ["submit", path, "--replace"]).exit_code == 0
    assert len(world.code_objects()) == 2 and world.spec("j")["code"] != stored["code"]


def test_workdir_takes_the_code_from_a_folder_in_place_of_the_specs(world, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.sh").write_text("echo hi\n")
    result = runner.invoke(app, ["submit", write_spec(tmp_path, code="gs://somewhere/else.tar.gz"),
                                 "--workdir", str(work)])
    assert result.exit_code == 0, result.output
    assert "--workdir" in result.output and "replaces the spec's code: gs://somewhere/else.tar.gz" in result.output
    [code] = world.code_objects()
    assert world.spec("j")["code"] == f"gs://{BUCKET}/{code}"


def test_a_folder_over_the_limit_is_refused_naming_its_biggest_files(world, tmp_path, monkeypatch):
    from controller.cli import pack

    monkeypatch.setattr(pack, "MAX_PACKED", 20_000)
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.bin").write_bytes(os.urandom(100_000))
    (src / "train.py").write_text("print(1)\n")
    result = runner.invoke(app, ["submit", write_spec(tmp_path, code="src")])
    assert result.exit_code == 2 and "code:" in result.output and "data.bin (0.1 MiB)" in result.output
    assert world.spec("j") is None and world.code_objects() == []


def test_code_that_cannot_be_read_is_one_line_never_a_traceback(world, tmp_path, monkeypatch):
    # `code: ~nobody/x` (Path.expanduser: RuntimeError) and a .tar.gz that cannot be read
    # (read outside any try) came out of respawn submit as tracebacks.
    result = runner.invoke(app, ["submit", write_spec(tmp_path, code="~no-such-user-respawn/src")])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "code: ~no-such-user-respawn/src:" in result.output
    tarball = tmp_path / "code.tar.gz"
    tarball.write_bytes(b"")

    read_bytes = type(tarball).read_bytes

    def unreadable(self):
        if self.name == tarball.name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(type(tarball), "read_bytes", unreadable)
    result = runner.invoke(app, ["submit", write_spec(tmp_path, code="code.tar.gz")])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "code.tar.gz: cannot be read: Permission denied" in result.output
    assert world.spec("j") is None and world.code_objects() == []


def test_a_gs_code_spec_is_uploaded_byte_for_byte(world, tmp_path):
    path = tmp_path / "j.yaml"
    text = "# my comment\n" + yaml.safe_dump(spec_doc(zones=ZONES, code="gs://my-bucket/code.tar.gz"))
    path.write_text(text)
    world.h.store.put("my-bucket", "code.tar.gz", b"tarball")  # there: submit checks that it is
    assert runner.invoke(app, ["submit", str(path)]).exit_code == 0
    assert world.h.store.read(BUCKET, names.spec_key("j")).data == text.encode()


# -- respawn run ---------------------------------------------------------------------------------

def test_run_makes_a_spec_from_flags_prints_it_and_submits_it_with_its_workdir(world, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print(1)\n")
    result = runner.invoke(app, [
        "run", "--name", "tune", "--zone", "us-central1-a,us-central1-b", "-z", "us-east1-b",
        "--machine-type", "n1-standard-8", "--accelerator", "nvidia-tesla-t4:2", "-p", "spot", "-p", "standard",
        "--checkpoint", "gs://ckpts/tune", "--env", "LR=0.001", "--workdir", str(work),
        "--", "python", "train.py", "--epochs", "3"])
    assert result.exit_code == 0, result.output
    stored = world.spec("tune")
    [code] = world.code_objects()
    assert stored == {
        "name": "tune", "zones": ["us-central1-a", "us-central1-b", "us-east1-b"], "machine_type": "n1-standard-8",
        "accelerators": {"type": "nvidia-tesla-t4", "count": 2}, "provisioning": ["spot", "standard"],
        "command": ["python", "train.py", "--epochs", "3"], "checkpoint": {"uri": "gs://ckpts/tune"},
        "env": {"LR": "0.001"}, "code": f"gs://{BUCKET}/{code}"}
    assert "name: tune" in result.output and "- python" in result.output  # the spec it made, printed
    assert row(result.output, "us-east1-b", "standard")[2] == "$0.70"  # 2 x T4 on demand, the table's GPU price
    assert "submitted tune" in result.output


def test_run_with_one_command_word_makes_a_bash_line_and_dry_run_submits_nothing(world, tmp_path):
    result = runner.invoke(app, ["run", "-n", "line", "-z", "us-central1-a", "-m", "g2-standard-8", "--dry-run",
                                 "--", "python train.py && echo done"])
    assert result.exit_code == 0, result.output
    assert "command: python train.py && echo done" in result.output and "estimate for line" in result.output
    assert world.spec("line") is None


def test_run_refuses_what_a_spec_would_refuse_naming_the_field(world):
    result = runner.invoke(app, ["run", "-n", "bad", "-z", "us-central1-a", "--accelerator", "nvidia-l4:many",
                                 "-m", "n1-standard-8", "--", "true"])
    assert result.exit_code == 2 and "--accelerator" in result.output
    result = runner.invoke(app, ["run", "-n", "bad", "-z", "nowhere", "-m", "n1-standard-8", "--", "true"])
    assert result.exit_code == 2 and "zones" in result.output and world.spec("bad") is None


def test_a_source_that_hangs_costs_the_estimate_its_wait_at_most_and_shows_a_dash():
    import threading
    import time

    hung = threading.Event()

    class Hanging:
        def advise(self, shape):
            hung.wait(30)
            return {}

        def region_quotas(self, project, region):
            hung.wait(30)
            return {}

    spec = parse_spec(yaml.safe_dump(spec_doc()), "llm")
    started = time.monotonic()
    try:
        got = estimate.gather(spec, "proj-1", estimate.Sources(advisor=Hanging(), quotas=Hanging()), wait=0.3)
    finally:
        hung.set()
    assert time.monotonic() - started < 5
    assert any("no answer within 0.3 s" in note for note in got.notes)
