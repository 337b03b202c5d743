"""examples/sweep.yaml on the local cloud, as shipped but for a shorter training: `respawn sweep submit`
writes its trials, the controller runs at most two at once, each trial trains with its own LR from its
own checkpoints and reports its loss, and `respawn sweep status` lists them best first."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli import buckets
from controller.cli.main import app
from controller.core import names
from controller.core.state import JobStatus, Phase
from controller.service import bootstrap
from localcloud.stack import LocalCloud, Options
from tests.harness import cli_against
from tests.wait import until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=1.0, boot_delay=0.1, shutdown_budget=5.0)) as c:
        yield c


def test_the_example_sweep_runs_two_at_a_time_and_lists_its_trials_best_first(cloud, tmp_path, monkeypatch):
    cli_against(cloud, monkeypatch)
    doc = yaml.safe_load((EXAMPLES / "sweep.yaml").read_text())
    doc["base"]["env"].update(TRAIN_STEPS="60", CHECKPOINT_EVERY="20", STEP_SECONDS="0.02")  # only: shorter
    shutil.copy(EXAMPLES / "trainer.py", tmp_path / "trainer.py")
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    runner = CliRunner()
    try:
        submitted = runner.invoke(app, ["sweep", "submit", str(tmp_path / "sweep.yaml")])
        assert submitted.exit_code == 0, submitted.output
        bucket = cloud.storage.bucket(cloud.options.bucket)
        trials = [f"lr-search-{n}" for n in (1, 2, 3)]
        most = 0

        def statuses() -> dict[str, JobStatus | None]:
            nonlocal most
            found = {}
            for job in trials:
                blob = bucket.get_blob(names.status_key(job))
                found[job] = JobStatus.from_json(blob.download_as_bytes()) if blob else None
            holding = {i["name"].rsplit("-", 1)[0] for i in cloud.compute.instances()}
            most = max(most, len(holding & set(trials)))
            return found

        final = until("every trial to finish", lambda: (s := statuses()) and all(x and x.phase.terminal for x in s.values())
                      and s, timeout=240)
        assert all(st.phase == Phase.SUCCEEDED for st in final.values()), {j: st.message for j, st in final.items()}
        assert most <= 2  # max_parallel
        assert [final[j].result["lr"] for j in trials] == [0.01, 0.03, 0.1]
        assert all(final[j].result["step"] == 60 for j in trials)
        saved = cloud.storage.bucket(buckets.checkpoints_bucket(cloud.options.bucket)).list_blobs(prefix="lr-search/")
        assert {b.name.split("/")[1] for b in saved} == set(trials)  # in the checkpoints bucket, each under its own prefix
        rows = json.loads(runner.invoke(app, ["sweep", "status", "lr-search", "--json"]).stdout)
        losses = [r["metric"] for r in rows]
        assert losses == sorted(losses) and {r["trial"] for r in rows} == set(trials)
    finally:
        bootstrap.override(None)
