"""Code from a local folder, end to end on the local cloud: `respawn submit` packs the folder
(its .respawnignore honoured), uploads it to gs://BUCKET/code/<sha256>.tar.gz, and the trainer
VM's agent (deploy/vm/startup.sh) fetches and unpacks it and runs the command in it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import yaml
from typer.testing import CliRunner

from controller.cli.main import app
from controller.core import names
from controller.core.state import JobStatus, Phase
from controller.service import bootstrap
from localcloud.stack import LocalCloud, Options
from tests.harness import cli_against
from tests.wait import until

# The job's own code: reads a file packed beside it, checks an ignored file stayed behind, and
# writes what it found to the bucket.
TRAIN = r"""#!/bin/bash
set -eu
seen="$(cat data/greeting.txt) from $(basename "$PWD")"
if [ -e secret.key ]; then seen="$seen, secret.key packed"; else seen="$seen, secret.key left out"; fi
echo "trainer: $seen"
printf '%s' "$seen" | curl -sf -o /dev/null -X POST --data-binary @- \
  "$STORAGE_EMULATOR_HOST/upload/storage/v1/b/$RESPAWN_BUCKET/o?uploadType=media&name=proof%2F$RESPAWN_JOB"
"""


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=2.0, boot_delay=0.1, shutdown_budget=5.0)) as c:
        yield c


def test_a_job_whose_code_is_a_local_folder_runs_that_code_on_its_vm(cloud, tmp_path, monkeypatch):
    cli_against(cloud, monkeypatch)
    src = tmp_path / "project" / "src"
    (src / "data").mkdir(parents=True)
    (src / "train.sh").write_text(TRAIN)
    (src / "data" / "greeting.txt").write_text("hello")
    (src / "secret.key").write_text("never uploaded")
    (src / ".respawnignore").write_text("*.key\n")
    job = "localcode"
    spec = tmp_path / "project" / f"{job}.yaml"
    spec.write_text(yaml.safe_dump({
        "zones": ["us-central1-a"], "machine_type": "g2-standard-8", "code": "src", "command": "bash train.sh",
        "heartbeat_interval": "1s", "policy": {"startup_grace": "1m", "idle_timeout": "1m"}}))
    try:
        result = CliRunner().invoke(app, ["submit", str(spec)])
    finally:
        bootstrap.override(None)
    assert result.exit_code == 0, result.output
    assert "estimate for localcode" in result.output and "obtainable now" in result.output

    bucket = cloud.storage.bucket(cloud.options.bucket)
    stored = yaml.safe_load(bucket.blob(names.spec_key(job)).download_as_bytes())
    assert re.fullmatch(rf"gs://{cloud.options.bucket}/code/[0-9a-f]{{64}}\.tar\.gz", stored["code"])

    def finished() -> JobStatus | None:
        blob = bucket.get_blob(names.status_key(job))
        found = JobStatus.from_json(blob.download_as_bytes()) if blob else None
        return found if found and found.phase.terminal else None

    final = until("the job to finish", finished, timeout=60)
    assert final.phase == Phase.SUCCEEDED, final.message
    assert bucket.blob(f"proof/{job}").download_as_text() == "hello from code, secret.key left out"
