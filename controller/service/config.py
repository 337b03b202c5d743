"""The controller's configuration: the only module that reads the environment.

Every setting is a ``RESPAWN_*`` variable (lists are comma-separated), so the same
code runs as a deployed function, under the local cloud, and from the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from pydantic import field_validator, model_validator

from controller.core import names
from controller.core.policy import ControllerPolicy
from controller.service.lease import MAX_TTL, Terms

REPO_ROOT = Path(__file__).resolve().parents[2]  # controller/service/config.py -> the repository
CsvList = Annotated[tuple[str, ...], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RESPAWN_", frozen=True, populate_by_name=True)

    bucket: str = ""
    project: str = Field(default="", validation_alias=AliasChoices("RESPAWN_PROJECT", "GOOGLE_CLOUD_PROJECT"))
    backend: Literal["google", "memory"] = "google"
    compute_endpoint: str | None = None  # e.g. http://127.0.0.1:8123 for the local cloud
    tpu_endpoint: str | None = None  # the local cloud's TPU server, e.g. http://127.0.0.1:8124
    vm_scripts: Path = REPO_ROOT / "deploy" / "vm"
    log_format: Literal["auto", "cloud", "text"] = "auto"
    # Where `respawn local up` writes its exports (local.env); the CLI reads it back to say where a
    # RESPAWN_BUCKET that names no bucket came from. None: ~/.respawn/local.
    local_dir: Path | None = None
    function_target: str | None = Field(default=None, validation_alias="FUNCTION_TARGET")

    allowed_projects: CsvList = ()
    allowed_zones: CsvList = ()
    extra_zones: CsvList = ()  # zones Google added since controller/core/zones.py (the CLI's check of specs)
    allowed_machine_types: CsvList = ()
    allowed_service_accounts: CsvList = ()  # default: the trainer account alone
    trainer_service_account: str | None = None  # what VMs run as when a spec names no account
    max_nodes: int = 8
    max_accelerators: int = 16
    allowed_tpu_types: CsvList = ()
    max_tpu_size: int = 32
    # Notifications (controller.service.notifier): every job's events to this Pub/Sub topic and webhook.
    notify_topic: str | None = None  # projects/P/topics/T
    notify_webhook: str | None = None  # a Slack-compatible incoming webhook URL
    allowed_notify_topics: CsvList = ()  # what a spec's notify.topic may name (default: a watched project's)
    allowed_webhook_hosts: CsvList = ("hooks.slack.com",)  # what a spec's notify.webhook may POST to
    # A spec's webhook on localhost / 127.0.0.1 (a deployed function's localhost is not the user's):
    # the local cloud sets it for its sink; `respawn deploy` never deploys it.
    allow_loopback_webhooks: bool = False
    # Seconds a pass waits, at its very end (after every job's chain), for its notifications still
    # under way; what is not sent by then is carried to the next pass (controller.service.notifier).
    notify_wait: float = Field(default=10.0, ge=0, le=300)
    pubsub_endpoint: str | None = None  # the local cloud's Pub/Sub server, e.g. http://127.0.0.1:8125
    logging_endpoint: str | None = None  # the local cloud's Cloud Logging server (`respawn logs` reads it)
    # What `respawn doctor` reads besides those (the local cloud's stand-ins of these APIs, each a
    # root URL such as http://127.0.0.1:8126; unset: Google's).
    serviceusage_endpoint: str | None = None
    resourcemanager_endpoint: str | None = None
    iam_endpoint: str | None = None
    functions_endpoint: str | None = None
    scheduler_endpoint: str | None = None
    artifactregistry_endpoint: str | None = None  # Artifact Registry's REST API (a spec's image:)
    # gcloud's access token file: the local cloud's dummy token (`respawn doctor`'s credentials there).
    access_token_file: Path | None = Field(default=None, validation_alias=AliasChoices(
        "RESPAWN_ACCESS_TOKEN_FILE", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"))
    # Jobs observed and reconciled side by side in one pass (threads: the clients block).
    concurrency: int = Field(default=32, ge=1, le=256)
    # How long a pass, from when it starts acting, waits for its inserts' operations (see
    # Engine.operation_wait); one still running then is read on the next pass (the same
    # request id), so a slow operation never holds a pass. Deletes are never waited for.
    operation_wait: float = Field(default=2.0, ge=0, le=600)
    # One pass over every job at a time (controller.service.lease), in seconds. The defaults suit a
    # one-minute Scheduler and the functions' 540 s timeout: a crashed holder's lease lapses within
    # 35 s, so the next tick takes it; the holder writes it every 10 s (GCS: one write a second).
    lease_ttl: float = Field(default=Terms.ttl, gt=0, le=MAX_TTL)
    lease_renew: float = Field(default=Terms.renew, ge=1)
    lease_margin: float = Field(default=Terms.margin, ge=0)
    lease_max_hold: float = Field(default=Terms.max_hold, gt=0)
    # Fan-out (controller.service.shards): with K > 1 the tick lists the bucket and publishes each
    # shard's part on this topic (in the controller's project); ``on_shard`` reconciles it. 1: the
    # tick reconciles every job itself, as before.
    shards: int = 1
    shard_topic: str = "respawn-shards"

    @field_validator(
        "allowed_projects", "allowed_zones", "extra_zones", "allowed_machine_types", "allowed_service_accounts",
        "allowed_tpu_types", "allowed_notify_topics", "allowed_webhook_hosts", mode="before",
    )
    @classmethod
    def _csv(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("allowed_projects")
    @classmethod
    def _literal_projects(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # The controller lists instances in each of these projects: a pattern cannot be listed.
        if globbed := [p for p in value if any(c in p for c in "*?[")]:
            raise ValueError(f"project ids, not patterns: {', '.join(globbed)}")
        return value

    @model_validator(mode="after")
    def _lease_renewed_in_time(self) -> Settings:
        self.lease_terms()  # raises ValueError (a ValidationError here) unless renew < ttl - margin
        return self

    @field_validator("shards")
    @classmethod
    def _shards(cls, value: int) -> int:
        if problem := names.shards_problem(value):
            raise ValueError(problem)
        return value

    def lease_terms(self) -> Terms:
        return Terms(ttl=self.lease_ttl, renew=self.lease_renew, margin=self.lease_margin, max_hold=self.lease_max_hold)

    @field_validator("trainer_service_account", "notify_topic", "notify_webhook", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: object) -> object:
        return (value.strip() or None) if isinstance(value, str) else value

    def policy(self) -> ControllerPolicy:
        return ControllerPolicy(
            default_project=self.project,
            allowed_projects=self.allowed_projects,
            allowed_zones=self.allowed_zones,
            extra_zones=self.extra_zones,
            allowed_machine_types=self.allowed_machine_types,
            allowed_service_accounts=self.allowed_service_accounts,
            trainer_service_account=self.trainer_service_account,
            max_nodes=self.max_nodes,
            max_accelerators=self.max_accelerators,
            allowed_tpu_types=self.allowed_tpu_types,
            max_tpu_size=self.max_tpu_size,
            notify_topic=self.notify_topic,
            notify_webhook=self.notify_webhook,
            allowed_notify_topics=self.allowed_notify_topics,
            allowed_webhook_hosts=self.allowed_webhook_hosts,
            allow_loopback_webhooks=self.allow_loopback_webhooks,
        )

    @property
    def cloud_logging(self) -> bool:
        """Structured JSON for Cloud Logging when running as a deployed function."""
        return self.log_format == "cloud" or (self.log_format == "auto" and self.function_target is not None)
