"""Container images (issue 37), what the controller does with them: the spec's ``image:``, what an
attempt's VMs carry, an image that can never run here failing the job once with its cause, a pull
that may pass retried as a failure, the pull's time through the records into the report's timeline."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from controller.cli import submitting
from controller.core import names
from controller.core.spec import CONTAINER_BOOT, CONTAINER_BOOT_GPU, JobSpec, SpecError, parse_spec
from controller.core.state import Phase
from controller.core.world import Record, listing_metadata
from controller.render import report
from tests.harness import BUCKET, Harness, spec_doc

IMAGE = "us-central1-docker.pkg.dev/proj/trainers/llm:1"


def spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"zones": ["us-central1-a"], "machine_type": "n2-standard-8", **fields})


@pytest.mark.parametrize("image", [IMAGE, "python:3.11", "nvcr.io/nvidia/pytorch:24.05-py3", "busybox",
                                   "localhost:5000/team/trainer@sha256:" + "a" * 64, "ghcr.io/org/img"])
def test_an_image_reference_docker_takes_is_taken(image):
    assert spec(image=image, command="python train.py").image == image


@pytest.mark.parametrize("image", ["gs://bucket/image", "Trainer:1", "host.io/Upper/x", "x:", "a//b", "x@sha256:12",
                                   "two words", "x:" + "t" * 129, "us-docker.pkg.dev/proj/image"])
def test_a_bad_image_reference_is_refused_naming_the_field_and_the_shape(image):
    with pytest.raises(SpecError) as e:
        parse_spec(json.dumps(spec_doc(image=image)).encode(), "llm")
    assert any(p.startswith("image:") for p in e.value.problems), e.value.problems


def test_an_image_job_may_leave_the_command_to_the_image_but_a_plain_one_may_not():
    assert spec(image=IMAGE).command_line == ""
    with pytest.raises(Exception, match="required: the bash line"):
        spec()


def test_an_image_job_boots_an_image_with_a_container_runtime_unless_it_names_one():
    cpu, gpu = spec(image=IMAGE), spec(image=IMAGE, machine_type="g2-standard-8")
    assert (cpu.boot_disk.image_family, cpu.boot_disk.image_project) == CONTAINER_BOOT
    assert (gpu.boot_disk.image_family, gpu.boot_disk.image_project) == CONTAINER_BOOT_GPU
    own = spec(image=IMAGE, boot_disk={"image_family": "my-docker-image", "image_project": "proj"})
    assert own.boot_disk.image_family == "my-docker-image"
    assert spec(command="x").boot_disk.image_family == "debian-12"  # a plain job: as before


def test_respawn_run_with_an_image_and_no_command_makes_a_spec_of_the_image_alone():
    doc = submitting.run_spec(name="t", zones=["us-central1-a"], command=[], machine_type="n2-standard-8",
                              accelerator=None, tpu=None, tpu_runtime=None, provisioning=[], nodes=1,
                              checkpoint=None, env=[], image=IMAGE)
    assert doc["image"] == IMAGE and "command" not in doc
    assert JobSpec.model_validate(doc).image == IMAGE


def started(h: Harness, **fields: Any) -> None:
    h.submit("llm", spec_doc(**fields))
    h.tick()
    h.tick()
    assert h.status("llm").phase == Phase.RUNNING


def exit_record(h: Harness, **body: Any) -> None:
    st = h.status("llm")
    h.store.put(BUCKET, names.exit_key("llm"), json.dumps(
        {"instance": f"llm-{st.attempt}", "attempt": st.attempt, "token": st.attempt_token, **body}))


def test_an_attempts_vms_carry_the_image_and_a_plain_jobs_carry_none(h):
    started(h, image=IMAGE)
    assert h.compute.request_of("llm-1").metadata["respawn-image"] == IMAGE
    h.submit("plain")
    h.tick()
    assert h.compute.request_of("plain-1").metadata["respawn-image"] == ""


def test_an_image_that_cannot_run_here_fails_the_job_once_naming_the_cause(h):
    started(h, image=IMAGE)
    why = (f"image {IMAGE} could not be pulled: Error: reading manifest 1 in {IMAGE}: denied: Permission "
           "\"artifactregistry.repositories.downloadArtifacts\" denied on resource")
    exit_record(h, exit_code=94, reason=why)
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.FAILED and st.attempt == 1 and st.restarts == 0
    assert "downloadArtifacts" in st.message and "not retried" in st.message and "(exit 94)" in st.message
    assert h.live() == []
    h.tick()
    assert h.status("llm").attempt == 1 and h.live() == [], "no second VM for an image that cannot run"


def test_a_pull_that_may_pass_is_a_failure_retried_after_its_backoff(h):
    started(h, image=IMAGE)
    exit_record(h, exit_code=95, reason=f"image {IMAGE} could not be pulled: 503 Service Unavailable")
    h.tick()
    st = h.status("llm")
    assert st.phase == Phase.RECOVERING and st.failures == 1 and "503" in st.message
    h.advance(minutes=5)
    h.tick()
    assert h.status("llm").attempt == 2


def test_a_trainer_exiting_94_by_itself_is_an_ordinary_failure(h):
    started(h, image=IMAGE)
    exit_record(h, exit_code=94)  # no reason: the trainer's own exit, not the agent's
    h.tick()
    assert h.status("llm").phase == Phase.RECOVERING


def test_a_reason_keeps_room_for_an_image_reference_and_the_registrys_words():
    long = "image " + "r/" * 200 + " could not be pulled: manifest unknown"
    record = Record.parse(_info(), json.dumps({"attempt": 1, "exit_code": 94, "reason": long}).encode())
    assert record is not None and record.detail == long[:600] and len(long) > 200


def _info() -> Any:
    from controller.core.ports import BlobInfo
    from datetime import UTC, datetime
    return BlobInfo(bucket=BUCKET, name="jobs/llm/exit", generation=1, updated=datetime(2026, 11, 30, tzinfo=UTC),
                    size=1)


def test_the_pull_times_are_read_from_a_record_and_its_listing_and_garbage_is_none():
    body = {"attempt": 1, "pull_started": "2026-11-30T00:00:01.000Z", "pull_ended": "2026-11-30T00:00:09.500Z",
            "pull_s": 8}
    record = Record.parse(_info(), json.dumps(body).encode())
    assert record is not None and record.pull_s == 8
    assert (record.pull_ended - record.pull_started) == timedelta(seconds=8.5)
    assert {"pull_started", "pull_ended", "pull_s"} <= set(listing_metadata(body))
    bad = Record.parse(_info(), json.dumps({"attempt": 1, "pull_started": "soon", "pull_s": -3}).encode())
    assert bad is not None and (bad.pull_started, bad.pull_s) == (None, None)


def test_the_report_draws_the_pull_inside_the_boot_as_pulling_image(h):
    started(h, image=IMAGE)
    st = h.status("llm")
    began = st.ledger.spans[-1].start
    pulled = (began + timedelta(seconds=20), began + timedelta(seconds=50))
    beat = {"instance": "llm-1", "attempt": 1, "token": st.attempt_token, "trainer_started":
            _z(began + timedelta(seconds=55)), "pull_started": _z(pulled[0]), "pull_ended": _z(pulled[1]), "pull_s": 30}
    h.store.put(BUCKET, names.heartbeat_key("llm"), json.dumps(beat))
    h.advance(minutes=2)
    h.tick()
    st = h.status("llm")
    span = st.ledger.spans[-1]
    assert (span.pull_started, span.pull_ended) == pulled
    drawn = report.pieces("llm", st, {span.zone or "?": 0}, h.clock.now())
    pulls = [p for p in drawn if p.hatch == report.PULL_HATCH]
    assert [(p.start, p.end) for p in pulls] == [pulled]
    boot = [p for p in drawn if p.hatch == report.BOOT_HATCH]
    assert boot[0].start == span.start and boot[0].end == pulled[0] and boot[-1].start == pulled[1]
    said = dict(report.facts(st, h.clock.now()))["image pulls"]
    assert said.startswith("1 attempt pulled the image before its trainer started: 30") and "part of booting" in said


def _z(t: Any) -> str:
    return t.isoformat().replace("+00:00", "Z")


def test_validate_says_the_image_it_runs_in_and_the_boot_image_it_gets(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from controller.cli.main import app

    monkeypatch.delenv("RESPAWN_PROJECT", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(f"zones: [us-central1-a]\nmachine_type: g2-standard-8\nimage: {IMAGE}\n")
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"runs in the container image {IMAGE}, on the boot image {CONTAINER_BOOT_GPU[1]}/{CONTAINER_BOOT_GPU[0]}" \
        in result.output


def test_a_pull_that_failed_on_a_vm_being_preempted_is_the_preemption_not_an_image_that_cannot_run(h):
    """Review 37: a VM preempted while it pulls (its network, its docker daemon going down with it) may
    end its pull with words the agent takes for "never" (94). Its marker says the platform took it: the
    job is recovered, as for any other exit record beside a marker (95, 97), never FAILED at once."""
    started(h, image=IMAGE)
    h.marker("llm", attempt=1)
    exit_record(h, exit_code=94, reason=f"image {IMAGE} could not be pulled: Error: copying system image: "
                                        "reading blob sha256:4031...: connection reset by peer")
    h.tick()
    st = h.status("llm")
    assert (st.phase, st.attempt, st.failures, st.preemptions) == (Phase.PROVISIONING, 2, 0, 1), st.message


def test_a_container_jobs_env_value_with_a_line_break_is_refused_naming_the_variable():
    with pytest.raises(SpecError) as e:
        parse_spec(json.dumps(spec_doc(image=IMAGE, env={"OK": "x", "NOTE": "two\nlines"})).encode(), "llm")
    assert any(p.startswith("env.NOTE: holds a line break") for p in e.value.problems), e.value.problems
    assert parse_spec(json.dumps(spec_doc(env={"NOTE": "two\nlines"})).encode(), "llm").env["NOTE"] == "two\nlines"
