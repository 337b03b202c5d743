"""Fan-out through the local cloud (issue 40, part 6): `respawn local up --shards 4`'s shape. The
tick, served by functions-framework, publishes each shard's listing with the real google-cloud-pubsub
client to the local Pub/Sub; its push subscription (Eventarc's, in CloudEvents mode) runs on_shard,
whose passes delete the orphans (no spec: no event would) and launch the jobs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controller.adapters.google import compute_gateway
from controller.core import names
from controller.service.config import Settings
from localcloud.stack import LocalCloud, Options
from tests.contract.test_ports import request_for
from tests.wait import until

K = 4


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCloud]:
    # No ticker of its own within the test: each tick is the test's.
    with LocalCloud(Options(tick_interval=3600.0, boot_delay=0.1, shutdown_budget=3.0, audit=False, shards=K,
                            log_dir=tmp_path_factory.mktemp("logs"))) as c:
        yield c


def test_a_tick_publishes_each_shard_its_listing_and_the_shards_reconcile_their_jobs(cloud):
    gateway = compute_gateway(Settings(project=cloud.options.project, compute_endpoint=cloud.compute.endpoint))
    orphans = [f"ghost-{i}" for i in range(6)]
    for job in orphans:  # labelled VMs whose job has no spec: only a shard's pass deletes them
        r = request_for(job)
        r = r.__class__(**{**r.__dict__, "project": cloud.options.project,
                           "labels": {**r.labels, names.SHARD_LABEL: names.shard_label(job)},
                           "metadata": {"startup-script": "#!/bin/bash\nsleep 300\n"}})
        gateway.insert([r], names.request_id(job, 1, 0))
    jobs = [f"job-{i}" for i in range(4)]
    bucket = cloud.storage.bucket(cloud.options.bucket)
    for job in jobs:
        bucket.blob(names.spec_key(job)).upload_from_string(yaml.safe_dump(
            {"zones": ["us-central1-a"], "machine_type": "g2-standard-8", "command": "sleep 600"}))
    answer = cloud.tick()
    assert answer["status"] == 200 and answer["published"] == K and answer["shards"] == K

    def live() -> set[str]:
        return {i.name for i in gateway.list_managed([cloud.options.project]).instances
                if i.status.alive}

    until("every orphan deleted by its shard", lambda: not {f"{j}-1" for j in orphans} & live(), timeout=60)
    until("every job's VM", lambda: {f"{j}-1" for j in jobs} <= live(), timeout=60)
    log = Path(cloud.options.log_dir or "", "function-on_shard.log")
    until("each shard's pass logged", lambda: log.read_text().count("shard pass done") >= K, timeout=30)
    assert sorted(i.labels.get(names.SHARD_LABEL) == names.shard_label(i.job or "")
                  for i in gateway.list_managed([cloud.options.project]).instances if i.job in jobs) == [True] * 4


def test_doctor_checks_the_fan_out_the_local_cloud_made_as_deploy_makes_it(cloud):
    from tests.integration.test_local_doctor import doctor, line

    done = doctor(cloud)
    said = line(done.stdout, f"{K} shards")
    assert said.startswith(f"✓ {K} shards"), done.stdout
    assert "respawn-on-shard ACTIVE" in said
