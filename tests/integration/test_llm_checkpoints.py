"""One job per framework on the local cloud: its first VM starts from the newest complete save.

Each tree (tests/checkpoint_trees.py) is written to the local GCS the way its library
writes it, cut off mid-save; the job's command prints what the VM agent gave it. The
first VM must get RESUME_FROM (plus RESUME_STEP and RESUME_TAG where the format has
them) naming the save the library's own rule proves complete, never the partial newer one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from controller.core import names
from controller.core.state import JobStatus, Phase
from localcloud.stack import LocalCloud, Options
from tests import checkpoint_trees as trees
from tests.wait import until

SHOW = 'echo "resume: from=[$RESUME_FROM] step=[$RESUME_STEP] tag=[$RESUME_TAG]"'


@pytest.fixture(scope="module")
def cloud() -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=2.0, boot_delay=0.1, shutdown_budget=5.0)) as c:
        yield c


def test_every_framework_job_starts_from_its_newest_complete_checkpoint(cloud):
    bucket = cloud.storage.bucket(cloud.options.bucket)
    made = [make() for make in trees.ALL]
    for tree in made:
        job = f"ck-{tree.name}"
        for name, data in tree.objects:  # in write order: a rewritten tracker gets a new generation
            bucket.blob(f"ckpt/{job}/{name}").upload_from_string(data)
        spec = {"zones": ["us-central1-a"], "machine_type": "g2-standard-8", "command": SHOW,
                "heartbeat_interval": "1s", "policy": {"startup_grace": "1m", "idle_timeout": "1m"},
                "checkpoint": {"uri": f"gs://{cloud.options.bucket}/ckpt/{job}", **tree.checkpoint}}
        bucket.blob(names.spec_key(job)).upload_from_string(yaml.safe_dump(spec))

    def done(job: str) -> JobStatus | None:
        blob = bucket.get_blob(names.status_key(job))
        status = JobStatus.from_json(blob.download_as_bytes()) if blob else None
        return status if status and status.phase.terminal else None

    for tree in made:
        job = f"ck-{tree.name}"
        final = until(f"{job} to finish", lambda job=job: done(job), timeout=90)
        assert final.phase == Phase.SUCCEEDED and final.attempt == 1, final.message
        uri = f"gs://{cloud.options.bucket}/ckpt/{job}/{tree.expected}"
        assert final.resume_from is not None and (final.resume_from.uri, final.resume_from.step, final.resume_from.tag) \
            == (uri, tree.step, tree.tag)
        log = (cloud.compute.workdir_of(f"{job}-1") / "serial-port-1.log").read_text()
        step = "" if tree.step is None else str(tree.step)
        assert f"resume: from=[{uri}] step=[{step}] tag=[{tree.tag or ''}]" in log, log[-2000:]
