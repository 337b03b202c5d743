"""The whole local cloud in one object: GCS, Compute, Cloud TPU, the three functions, Scheduler, Eventarc,
Pub/Sub and an incoming-webhook sink for notifications, Cloud Logging with the VMs' serial output and
Compute's System Event audit log in it, and Artifact Registry (``LocalCloud.registry``: the Docker
endpoint podman pulls from, ``registry.environment()`` what a VM needs for it; its REST API beside
the other stand-ins doctor reads).

The functions run as real ``functions-framework`` processes serving ``main.py``, with
the same environment a deployment gives them, pointed at the local servers.

The audit path (``Options.audit``, on by default) is what ``respawn deploy`` sets up on Google,
done here through the servers' own REST APIs: a Pub/Sub topic ``respawn-audit``; a Logging sink
``respawn-audit`` (``controller.core.audit.sink_filter``, destination that topic, a unique writer
identity); ``roles/pubsub.publisher`` on the topic for the sink's writer identity; and the push
subscription Eventarc makes for a Pub/Sub-triggered gen2 function, to ``on_audit`` in CloudEvents
mode. Compute and Cloud TPU write their System Event audit entries into Cloud Logging whether or
not it is on; off, no sink routes them to ``on_audit``.
The log-based metrics of the fleet's figures (``deploy/metrics``) are made in its Logging too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import yaml

from controller.cli import buckets
from controller.cli.deploy import AUDIT_SINK, AUDIT_TIMEOUT, AUDIT_TOPIC
from controller.core.audit import sink_filter
from controller.service.config import REPO_ROOT
from localcloud.apis import SERVERS, Deployment, DiscoveryServer, ResourceManagerServer
from localcloud import images
from localcloud.compute import ComputeServer
from localcloud.events import Ticker, Watcher
from localcloud.gcs import LocalGcs, client
from localcloud.logging import LoggingServer
from localcloud.vmlogs import VmLogs
from localcloud.pubsub import PubsubServer
from localcloud.realism import Delay, Realism
from localcloud.registry import Registry
from localcloud.registry_api import ArtifactRegistryServer
from localcloud.runlogs import FunctionLogs
from localcloud.tpu import TpuServer
from localcloud.webhook import WebhookSink


@dataclass
class Options:
    bucket: str = "respawn-local"
    project: str = "respawn-local"
    tick_interval: float = 60.0
    boot_delay: float = 0.3
    shutdown_budget: float = 30.0
    # A Spot VM's preemption notice (scheduling.preemptionNoticeDuration, 120 s on Google) lasts this
    # share of itself; None: as much as the shutdown budget is of Spot's 30 s (one time scale for the
    # local world: a 3 s shutdown comes with a 12 s notice).
    notice_scale: float | None = None
    vm_scripts: Path | None = None  # default: the project's deploy/vm
    log_dir: Path | None = None
    policy_env: dict[str, str] | None = None
    gcs_write_interval: float | None = None  # GCS's per-object write rate (about 1 s); None: realism's (off by default)
    gcs_pin_generations: bool = False  # downloads pinned to the generation read, as on Google
    # Latency, operation durations and rate limits of every server: Realism.google() for benchmarks.
    realism: Realism = field(default_factory=Realism)
    # Every job's notifications to the Pub/Sub stand-in's topic NOTIFY_TOPIC and to the webhook sink.
    notify: bool = False
    region: str = "us-central1"  # where the local functions and Scheduler job are said to run (respawn doctor)
    # Compute's System Event audit entries through a Logging sink, Pub/Sub and Eventarc to on_audit.
    audit: bool = True
    # The audit path's delays (None: the realism's, else localcloud.logging.SINK_DELAY and
    # localcloud.pubsub.PUSH_DELAY); a Lognormal is drawn for each entry or message.
    sink_delay: Delay | None = None  # Log Router's
    push_delay: Delay | None = None  # Pub/Sub push's
    # K > 1: the fan-out (controller.service.shards), as `respawn deploy --shards K` makes it: the tick
    # publishes each shard's listing on SHARD_TOPIC, whose push subscription (Eventarc's) runs on_shard.
    shards: int = 1
    # The trainer image (localcloud.images.TRAINER_IMAGE, in this project) in the local Artifact Registry
    # from the start: examples/container.yaml runs in it. A few seconds (cached), so off unless asked.
    images: bool = False


NOTIFY_TOPIC = "respawn-events"
SHARD_TOPIC = "respawn-shards"
PUBLISHER = "roles/pubsub.publisher"


class LocalCloud:
    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()
        self.gcs = LocalGcs(buckets=(self.options.bucket, *self.checkpoints_buckets), project=self.options.project,
                            write_interval=self.options.gcs_write_interval,
                            pin_generations=self.options.gcs_pin_generations, realism=self.options.realism)
        self.compute: ComputeServer | None = None
        self.tpu: TpuServer | None = None
        self.pubsub: PubsubServer | None = None
        self.webhook: WebhookSink | None = None
        self.logging: LoggingServer | None = None
        self.vm_logs: VmLogs | None = None  # each VM's and TPU worker's serial output, line by line, into Cloud Logging
        self.function_logs: FunctionLogs | None = None  # the functions' log lines (log_dir's), as Cloud Run's
        self._functions: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        self.ticker: Ticker | None = None
        self.watcher: Watcher | None = None
        # Service Usage, Resource Manager, IAM, Cloud Functions and Cloud Scheduler, answering for
        # what runs here (localcloud.apis): what `respawn doctor` reads.
        self.apis: dict[str, DiscoveryServer] = {}
        # Artifact Registry: its Docker endpoint (LOCATION-docker.pkg.dev, through an HTTPS proxy), which
        # podman pulls from with a VM's own token; its REST API is self.apis["artifactregistry"].
        self.registry: Registry | None = None
        self._scratch: tempfile.TemporaryDirectory[str] | None = None  # the gcloud token file's folder

    @property
    def gcloud_token(self) -> Path:
        """A dummy access token for gcloud (``auth/access_token_file``): the local servers check
        none, but without credentials gcloud refuses to send a request at all."""
        assert self._scratch is not None, "not started"
        return Path(self._scratch.name) / "gcloud-access-token"

    def start(self) -> LocalCloud:
        o = self.options
        try:
            self._scratch = tempfile.TemporaryDirectory(prefix="respawn-local-")
            self.gcloud_token.write_text("local-cloud-token\n")
            self.gcloud_token.chmod(0o600)
            self.gcs.start()
            self.storage = client(self.gcs.url, o.project)
            # Before Compute: its environment() is what a VM's podman needs (localcloud.registry).
            self.registry = Registry(accounts=self._token_account, project_policy=self._project_policy).start()
            if o.images:
                self.push_trainer_image()
            vm_path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
            # A VM's podman reaches Artifact Registry's hosts through the registry's proxy, as on Google.
            vm_env = {"STORAGE_EMULATOR_HOST": self.gcs.url, "PATH": vm_path, **self.registry.environment()}
            scale = o.shutdown_budget / 30.0 if o.notice_scale is None else o.notice_scale
            self.compute = ComputeServer(vm_env=vm_env, boot_delay=o.boot_delay, shutdown_budget=o.shutdown_budget,
                                         realism=o.realism, notice_scale=scale).start()
            self.tpu = TpuServer(vm_env=vm_env, boot_delay=o.boot_delay, shutdown_budget=o.shutdown_budget,
                                 realism=o.realism).start()
            push_delay, sink_delay = o.push_delay or o.realism.push_delay, o.sink_delay or o.realism.sink_delay
            self.pubsub = PubsubServer(**({} if push_delay is None else {"push_delay": push_delay})).start()
            self.logging = LoggingServer(pubsub=self.pubsub,
                                         **({} if sink_delay is None else {"sink_delay": sink_delay})).start()
            self.compute.audit_log = self.tpu.audit_log = self.logging.write
            self.vm_logs = VmLogs(self.logging, self.compute, tpu=self.tpu).start()
            if o.log_dir is not None:  # without it the functions' output goes nowhere to be read
                self.function_logs = FunctionLogs(self.logging, o.log_dir, o.project, o.region).start()
            self.webhook = WebhookSink().start()
            self.deployment = Deployment(o.project, o.region, o.bucket, functions=self._function_states,
                                         ticker=self._ticker_state, shards=o.shards)
            self.apis = {server.name: server(self.deployment).start() for server in SERVERS}
            self.apis["artifactregistry"] = ArtifactRegistryServer(self.deployment, self.registry).start()
            self._deploy_bucket_iam()
            if o.notify:
                requests.put(f"{self.pubsub.endpoint}/v1/{self.notify_topic}", json={}, timeout=10).raise_for_status()
            for target in ("tick", "on_object", *(("on_audit",) if o.audit else ()),
                           *(("on_shard",) if o.shards > 1 else ())):
                self._functions[target] = self._serve(target)
            if o.audit:
                self._deploy_audit()
            if o.shards > 1:
                self._deploy_shards()
            self._deploy_metrics()
            self.watcher = Watcher(self.storage, o.bucket, self.function_url("on_object"),
                                   prefixes=("jobs/", "preempted-jobs/")).start()
            self.ticker = Ticker(self.function_url("tick"), o.tick_interval).start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def trainer_image(self) -> str:
        """Where the trainer image is served: TRAINER_IMAGE, in this local cloud's project."""
        return images.TRAINER_IMAGE.replace("/respawn-local/", f"/{self.options.project}/", 1)

    def push_trainer_image(self) -> str:
        """The trainer image (localcloud.images) into the local Artifact Registry; its digest. Raises
        images.NoBusybox where this machine cannot make one."""
        assert self.registry is not None, "not started"
        return self.registry.push_rootfs(self.trainer_image, images.trainer_rootfs(), env=images.TRAINER_ENV)

    def _token_account(self, token: str) -> str | None:
        """Whose an access token is: a Compute instance's or a TPU worker's metadata-server token."""
        for server in (self.compute, self.tpu):
            if server is not None and (email := server.token_account(token)):
                return email
        return None

    def _project_policy(self, project: str) -> list[dict[str, Any]]:
        """A project's bindings, as the Resource Manager stand-in holds them (deploy's, and changes since)."""
        server = self.apis.get("resourcemanager")
        return server.policy(project) if isinstance(server, ResourceManagerServer) else []

    def _function_states(self) -> dict[str, tuple[str, bool]]:
        return {target: (self.function_url(target), process.poll() is None)
                for target, (process, _) in list(self._functions.items())}

    def _ticker_state(self) -> tuple[bool, Any, int | None]:
        ticker = self.ticker
        return (False, None, None) if ticker is None else (ticker.running, ticker.last_attempt, ticker.last_status)

    @property
    def checkpoints_buckets(self) -> tuple[str, ...]:
        """The checkpoints bucket `respawn deploy` makes beside the control bucket (controller.cli.buckets:
        `respawn run`'s default place for checkpoints); none where the control bucket's name leaves none."""
        try:
            return (buckets.checkpoints_bucket(self.options.bucket),)
        except ValueError:
            return ()

    def _deploy_bucket_iam(self) -> None:
        """What `respawn deploy` does to the control bucket: uniform bucket-level access on, then the
        controller's and the trainer's (conditional) bindings, through the JSON API; and to the
        checkpoints bucket: uniform access, the trainer's read and write, the controller's read."""
        for name, bindings in ((self.options.bucket, self.deployment.bucket_policy()),
                               *((name, self.deployment.checkpoints_policy()) for name in self.checkpoints_buckets)):
            bucket = self.storage.get_bucket(name)
            bucket.iam_configuration.uniform_bucket_level_access_enabled = True
            bucket.patch()
            policy = bucket.get_iam_policy(requested_policy_version=3)
            policy.version = 3
            for binding in bindings:
                policy.bindings.append({**binding, "members": set(binding["members"])})
            bucket.set_iam_policy(policy)

    @property
    def audit_topic(self) -> str:
        return f"projects/{self.options.project}/topics/{AUDIT_TOPIC}"

    @property
    def audit_subscription(self) -> str:
        """The push subscription Eventarc would make for on_audit's Pub/Sub trigger."""
        return f"projects/{self.options.project}/subscriptions/eventarc-{self.options.region}-on-audit"

    def _deploy_metrics(self) -> None:
        """The log-based metrics of the fleet's figures (``deploy/metrics``), as ``respawn deploy`` makes
        them on Google, through Logging's REST API (``projects.metrics.update`` creates an absent one)."""
        assert self.logging is not None
        for path in sorted((REPO_ROOT / "deploy" / "metrics").glob("respawn_*.yaml")):
            requests.put(f"{self.logging.endpoint}/v2/projects/{self.options.project}/metrics/{path.stem}",
                         json=yaml.safe_load(path.read_text()), timeout=10).raise_for_status()

    def _deploy_audit(self) -> None:
        """The audit path, as ``respawn deploy`` makes it on Google, through the servers' REST APIs:
        topic, sink (unique writer identity), the writer's publisher grant, Eventarc's push subscription."""
        assert self.pubsub is not None and self.logging is not None
        project, pubsub, logging_ = self.options.project, self.pubsub.endpoint, self.logging.endpoint
        requests.put(f"{pubsub}/v1/{self.audit_topic}", json={}, timeout=10).raise_for_status()
        sink = requests.post(f"{logging_}/v2/projects/{project}/sinks", params={"uniqueWriterIdentity": "true"},
                             json={"name": AUDIT_SINK, "destination": f"pubsub.googleapis.com/{self.audit_topic}",
                                   "filter": sink_filter(project)}, timeout=10)
        sink.raise_for_status()
        policy = requests.get(f"{pubsub}/v1/{self.audit_topic}:getIamPolicy", timeout=10)
        policy.raise_for_status()
        bindings = [*policy.json().get("bindings", []),
                    {"role": PUBLISHER, "members": [sink.json()["writerIdentity"]]}]
        requests.post(f"{pubsub}/v1/{self.audit_topic}:setIamPolicy",
                      json={"policy": {**policy.json(), "bindings": bindings}}, timeout=10).raise_for_status()
        # Eventarc's subscription for a Pub/Sub trigger: the function's URL in CloudEvents mode, the
        # function's timeout (deploy's --timeout) as the ack deadline, the 10 s to 600 s retry policy.
        endpoint = f"{self.function_url('on_audit')}?__GCP_CloudEventsMode=CUSTOM_PUBSUB_{quote(self.audit_topic, safe='')}"
        requests.put(f"{pubsub}/v1/{self.audit_subscription}", json={
            "topic": self.audit_topic, "pushConfig": {"pushEndpoint": endpoint},
            "ackDeadlineSeconds": int(AUDIT_TIMEOUT.rstrip("s")),
            "retryPolicy": {"minimumBackoff": "10s", "maximumBackoff": "600s"}}, timeout=10).raise_for_status()

    @property
    def shard_topic(self) -> str:
        return f"projects/{self.options.project}/topics/{SHARD_TOPIC}"

    def _deploy_shards(self) -> None:
        """The shards' topic and on_shard's Pub/Sub trigger (the push subscription Eventarc makes),
        as `respawn deploy --shards K` makes them on Google."""
        assert self.pubsub is not None
        pubsub = self.pubsub.endpoint
        requests.put(f"{pubsub}/v1/{self.shard_topic}", json={}, timeout=10).raise_for_status()
        controller = f"serviceAccount:{self.deployment.controller}"  # the tick publishes as the controller
        requests.post(f"{pubsub}/v1/{self.shard_topic}:setIamPolicy", json={"policy": {"bindings": [
            {"role": PUBLISHER, "members": [controller]}]}}, timeout=10).raise_for_status()
        endpoint = f"{self.function_url('on_shard')}?__GCP_CloudEventsMode=CUSTOM_PUBSUB_{quote(self.shard_topic, safe='')}"
        subscription = f"projects/{self.options.project}/subscriptions/eventarc-{self.options.region}-on-shard"
        requests.put(f"{pubsub}/v1/{subscription}", json={
            "topic": self.shard_topic, "pushConfig": {"pushEndpoint": endpoint},
            "ackDeadlineSeconds": int(AUDIT_TIMEOUT.rstrip("s")),
            "retryPolicy": {"minimumBackoff": "10s", "maximumBackoff": "600s"}}, timeout=10).raise_for_status()

    def env(self) -> dict[str, str]:
        """What a user exports to point clients (the CLI, gsutil-free scripts, gcloud) here."""
        assert self.compute is not None and self.tpu is not None
        return {
            "STORAGE_EMULATOR_HOST": self.gcs.url,
            "RESPAWN_COMPUTE_ENDPOINT": self.compute.endpoint,
            "RESPAWN_TPU_ENDPOINT": self.tpu.endpoint,
            "RESPAWN_BUCKET": self.options.bucket,
            "RESPAWN_PROJECT": self.options.project,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{self.compute.endpoint}/compute/v1/",
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": f"{self.tpu.endpoint}/",
            "CLOUDSDK_CORE_PROJECT": self.options.project,
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(self.gcloud_token),  # gcloud runs with no login
            "RESPAWN_VM_SCRIPTS": str(self.options.vm_scripts or REPO_ROOT / "deploy" / "vm"),
            # What `respawn deploy` creates on a real project: VMs run as a dedicated account.
            "RESPAWN_TRAINER_SERVICE_ACCOUNT": f"respawn-trainer@{self.options.project}.iam.gserviceaccount.com",
            # Notifications: the Pub/Sub stand-in (REST) and a webhook sink. The sink's URL is only
            # offered: nothing here turns notifications on.
            **({"RESPAWN_PUBSUB_ENDPOINT": self.pubsub.endpoint,
                "CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB": f"{self.pubsub.endpoint}/"} if self.pubsub else {}),
            # The sink is on 127.0.0.1: a spec may name it only because the local cloud says so
            # (a deployed function refuses a loopback webhook, whatever RESPAWN_ALLOWED_WEBHOOK_HOSTS).
            **({"RESPAWN_LOCAL_WEBHOOK": self.webhook.url, "RESPAWN_ALLOW_LOOPBACK_WEBHOOKS": "true"}
               if self.webhook else {}),
            **({"RESPAWN_LOGGING_ENDPOINT": self.logging.endpoint,
                "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": f"{self.logging.endpoint}/"} if self.logging else {}),
            **({"RESPAWN_NOTIFY_TOPIC": self.notify_topic, "RESPAWN_NOTIFY_WEBHOOK": self.webhook.url}
               if self.options.notify and self.webhook else {}),
            # What respawn doctor reads besides (localcloud.apis), and where it looks for the deployment.
            "RESPAWN_REGION": self.options.region,
            **{f"RESPAWN_{key.upper()}_ENDPOINT": server.endpoint for key, server in self.apis.items()},
            **{f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{gcloud}": f"{self.apis[key].endpoint}/"
               for key, gcloud in (("serviceusage", "SERVICEUSAGE"), ("resourcemanager", "CLOUDRESOURCEMANAGER"),
                                   ("iam", "IAM"), ("functions", "CLOUDFUNCTIONS"), ("scheduler", "CLOUDSCHEDULER"),
                                   ("artifactregistry", "ARTIFACTREGISTRY"))
               if key in self.apis},
            **({"RESPAWN_SHARDS": str(self.options.shards), "RESPAWN_SHARD_TOPIC": SHARD_TOPIC}
               if self.options.shards > 1 else {}),
            **(self.options.policy_env or {}),
        }

    @property
    def notify_topic(self) -> str:
        return f"projects/{self.options.project}/topics/{NOTIFY_TOPIC}"

    def function_url(self, target: str) -> str:
        return f"http://127.0.0.1:{self._functions[target][1]}/"

    def tick(self, patience: float = 60.0) -> dict:
        """One Scheduler run, now (what ``gcloud scheduler jobs run`` does), that made a pass: a run
        answered "another pass holds the lease" (the local ticker's, or a hint's pass over every
        job) is made again once that pass may be done, for up to ``patience`` seconds."""
        deadline = time.monotonic() + patience
        while True:
            response = requests.post(self.function_url("tick"), json={}, timeout=600)
            found = {"status": response.status_code, **(response.json() if response.content else {})}
            if not found.get("skipped") or time.monotonic() > deadline:
                return found
            time.sleep(0.5)

    def stop(self) -> None:
        for loop in (self.ticker, self.watcher):
            if loop:
                loop.stop()
        for process, _ in self._functions.values():  # all at once: each takes most of a second to end
            process.terminate()
        deadline = time.monotonic() + 10
        for process, _ in self._functions.values():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._functions.clear()
        if self.vm_logs:  # its last sweep reads the VMs' folders, which go with the Compute server
            self.vm_logs.stop()
        if self.function_logs:
            self.function_logs.stop()
        for server in (self.webhook, self.pubsub, self.logging, *self.apis.values()):
            if server:
                server.stop()
        self.apis = {}
        if self.tpu:
            self.tpu.stop()
        if self.compute:
            self.compute.stop()
        if self.registry:
            self.registry.stop()
            self.registry = None
        self.gcs.stop()
        if self._scratch:
            self._scratch.cleanup()
            self._scratch = None

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, target: str) -> tuple[subprocess.Popen[bytes], int]:
        env = {**os.environ, **self.env(), "RESPAWN_LOG_FORMAT": "text", "PYTHONUNBUFFERED": "1"}
        return serve_function(target, env, self.options.log_dir)


def serve_function(target: str, env: dict[str, str], log_dir: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``main.py``'s ``target`` served by functions-framework in a process of its own, as
    Cloud Functions runs it: (the process, its port), once it listens."""
    port = _free_port()
    out = open(log_dir / f"function-{target}.log", "ab") if log_dir else subprocess.DEVNULL
    process = subprocess.Popen(
        [sys.executable, "-m", "functions_framework", "--target", target, "--source", str(REPO_ROOT / "main.py"),
         "--host", "127.0.0.1", "--port", str(port)] + ([] if target == "tick" else ["--signature-type", "cloudevent"]),
        cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        # A session of its own: Ctrl-C (SIGINT to the terminal's process group) reaches the process
        # that started it, which stops the Scheduler and Eventarc first, then it (LocalCloud.stop).
        # In the terminal's group it died first, and every tick or event sent to it was a traceback.
        start_new_session=True)
    try:
        _wait_for_port(port, process)
    except BaseException:
        process.kill()  # never left serving (or starting) when its start is given up
        process.wait()
        raise
    return process, port


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"functions-framework exited with {process.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"functions-framework did not listen on {port} within {timeout}s")
