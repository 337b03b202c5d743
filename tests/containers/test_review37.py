"""Review of issue 37 (container images), over the whole local cloud with real podman: a pull that fails for a
reason that may pass is retried whatever digits the image's tag holds; a container whose runtime CLI ends
while it still runs is not taken for a trainer that exited 0."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.core.state import Phase
from localcloud.stack import LocalCloud, Options
from tests.containers.test_local_images import ended, serial, submit
from tests.wait import until

HOST = "us-central1-docker.pkg.dev"


@pytest.fixture(scope="module")
def cloud(podman) -> Iterator[LocalCloud]:
    with LocalCloud(Options(tick_interval=1.0, boot_delay=0.1, shutdown_budget=3.0)) as c:
        yield c


@pytest.fixture(scope="module")
def busybox(cloud, busybox_rootfs) -> str:
    ref = f"{HOST}/{cloud.options.project}/images/busybox:1"
    cloud.registry.push_rootfs(ref, busybox_rootfs)
    return ref


def doc(name: str, image: str, command: str, **more) -> dict:
    return {"name": name, "zones": ["us-central1-a"], "machine_type": "n2-standard-8", "image": image,
            "command": command, **more}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tag", ["1", "20240312"])
def test_a_registry_that_does_not_answer_is_a_pull_that_may_pass_whatever_digits_its_tag_holds(
        cloud, tmp_path, monkeypatch, tag):
    """Podman says the reference in every line (and the digests of what it copied): 403 or 401 in a date tag
    (20240312, 20240115), a project or a digest is not the registry's refusal. The agent read it so and wrote
    94: the job FAILED at once, "not retried", for a registry that merely did not answer."""
    job = f"down-{tag}"
    submit(cloud, monkeypatch, tmp_path, doc(job, f"127.0.0.1:1/proj/trainer:{tag}", "true",
                                             policy={"max_failures": 0}))
    st = ended(cloud, job, timeout=150)
    assert st.phase == Phase.FAILED and "connection refused" in st.message, st.message
    assert "(exit 95)" in st.message and "not retried" not in st.message, st.message


def _cli_of(container: str) -> int | None:
    """The pid of `podman start --attach CONTAINER` (the trainer the shutdown script signals)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"start" in argv and b"--attach" in argv and container.encode() in argv:
                return int(entry.name)
    return None


@pytest.mark.timeout(180)
def test_a_runtime_cli_that_ends_while_its_container_runs_is_not_an_exit_0(cloud, busybox, tmp_path, monkeypatch):
    """The attached CLI is what the agent waits for; when it ends first (killed, or docker's daemon restarted
    under it with live-restore), the container runs on and its State.ExitCode reads 0. The agent took that for
    the trainer's exit 0: the job SUCCEEDED, and `rm -f` killed the trainer in the middle of its work."""
    job = "cli-dies"
    submit(cloud, monkeypatch, tmp_path, doc(job, busybox, "echo cli-dies-began; sleep 8; exit 3",
                                             policy={"max_failures": 0}))
    until("the trainer to run", lambda: "cli-dies-began" in serial(cloud, f"{job}-1"), timeout=120)
    pid = until("the attached CLI", lambda: _cli_of(f"respawn-{job}-1-0"), timeout=10)
    os.kill(pid, signal.SIGKILL)
    st = ended(cloud, job, timeout=120)
    assert st.phase != Phase.SUCCEEDED, st.message
    assert "code 3" in st.message, st.message
