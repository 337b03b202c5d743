"""``respawn deploy``: both functions, the Scheduler job, the VM scripts, as a plan of steps.

The plan is data, so ``--dry-run`` prints exactly what a real run would execute: the
``gcloud functions deploy`` command lines and the Cloud Scheduler API request.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.config import REPO_ROOT

TICK, ON_OBJECT = "respawn-tick", "respawn-on-object"
URL_PLACEHOLDER = "<url of respawn-tick>"


@dataclass(frozen=True)
class Target:
    project: str
    region: str
    bucket: str
    controller_sa: str
    scheduler_sa: str
    schedule: str = "* * * * *"
    source: Path = REPO_ROOT
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    title: str
    argv: tuple[str, ...] = ()
    request: dict[str, Any] | None = None
    uploads: tuple[tuple[Path, str], ...] = ()

    def render(self) -> str:
        if self.argv:
            return shlex.join(self.argv)
        if self.request is not None:
            return json.dumps(self.request, indent=2)
        return "\n".join(f"upload {path} -> gs://{dest}" for path, dest in self.uploads)


def plan(t: Target) -> list[Step]:
    env = {"RESPAWN_BUCKET": t.bucket, "RESPAWN_PROJECT": t.project, **t.env}
    common = ("--gen2", "--runtime=python311", f"--region={t.region}", f"--project={t.project}",
              f"--source={t.source}", f"--service-account={t.controller_sa}",
              "--set-env-vars=" + ",".join(f"{k}={v}" for k, v in sorted(env.items())), "--memory=512Mi")
    job = f"projects/{t.project}/locations/{t.region}/jobs/respawn-tick"
    scripts = REPO_ROOT / "deploy" / "vm"
    return [
        Step("deploy the tick function (HTTP, authenticated only)",
             ("gcloud", "functions", "deploy", TICK, *common, "--entry-point=tick", "--trigger-http",
              "--no-allow-unauthenticated", "--timeout=540s")),
        Step("deploy the on_object function (GCS finalize events, retried)",
             ("gcloud", "functions", "deploy", ON_OBJECT, *common, "--entry-point=on_object",
              "--trigger-event-filters=type=google.cloud.storage.object.v1.finalized",
              f"--trigger-event-filters=bucket={t.bucket}", "--retry", "--timeout=540s")),
        Step("let the scheduler's service account invoke tick",
             ("gcloud", "functions", "add-invoker-policy-binding", TICK, "--gen2", f"--region={t.region}",
              f"--project={t.project}", f"--member=serviceAccount:{t.scheduler_sa}")),
        Step("create or update the Cloud Scheduler job (google-cloud-scheduler API)", request={
            "parent": f"projects/{t.project}/locations/{t.region}",
            "job": {
                "name": job,
                "description": "respawn: reconcile every job",
                "schedule": t.schedule,
                "time_zone": "Etc/UTC",
                # runs of one Scheduler job never overlap; a pass must end well within this
                "attempt_deadline": "600s",
                "retry_config": {"retry_count": 0},
                "http_target": {"uri": URL_PLACEHOLDER, "http_method": "POST",
                                "oidc_token": {"service_account_email": t.scheduler_sa, "audience": URL_PLACEHOLDER}},
            },
        }),
        Step("upload the VM scripts, for reference (the controller embeds its own copy)",
             uploads=tuple((p, f"{t.bucket}/respawn/vm/{p.name}") for p in sorted(scripts.glob("*.sh")))),
    ]


Runner = Callable[[tuple[str, ...]], str]


def run_command(argv: tuple[str, ...]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def execute(steps: list[Step], t: Target, run: Runner = run_command, say: Callable[[str], None] = print) -> None:
    """Carry the plan out; the Scheduler job gets the tick function's real URL."""
    url = URL_PLACEHOLDER
    for step in steps:
        say(step.title)
        if step.argv:
            run(step.argv)
            if step.argv[3] == TICK and "deploy" in step.argv:
                url = run(("gcloud", "functions", "describe", TICK, "--gen2", f"--region={t.region}",
                           f"--project={t.project}", "--format=value(serviceConfig.uri)")).strip()
        elif step.request is not None:
            _upsert_scheduler_job(json.loads(step.render().replace(URL_PLACEHOLDER, url)))
        else:
            _upload(step.uploads, t.project)


def _upsert_scheduler_job(request: dict[str, Any]) -> None:
    from google.api_core import exceptions
    from google.cloud import scheduler_v1

    client = scheduler_v1.CloudSchedulerClient()
    job = scheduler_v1.Job(request["job"])
    try:
        client.create_job(parent=request["parent"], job=job)
    except exceptions.AlreadyExists:
        client.update_job(job=job)


def _upload(uploads: tuple[tuple[Path, str], ...], project: str) -> None:
    from google.cloud import storage

    client = storage.Client(project=project)
    for path, dest in uploads:
        bucket, _, name = dest.partition("/")
        client.bucket(bucket).blob(name).upload_from_filename(str(path))
