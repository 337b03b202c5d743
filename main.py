"""Cloud Functions entry points (2nd gen). Thin on purpose: see controller/service/functions.py."""

import functions_framework
from cloudevents.http import CloudEvent
from flask import Request

from controller.service import collector

collector.tune()  # before the controller's modules load: see controller/service/collector.py
from controller.service import functions  # noqa: E402


@functions_framework.http
def tick(request: Request) -> tuple[dict, int]:
    """Cloud Scheduler, every minute (OIDC-authenticated): reconcile every job."""
    return functions.tick()


@functions_framework.cloud_event
def on_object(event: CloudEvent) -> None:
    """google.cloud.storage.object.v1.finalized on the bucket: reconcile that object's job."""
    functions.on_object(event.get_data() or {})


@functions_framework.cloud_event
def on_audit(event: CloudEvent) -> None:
    """google.cloud.pubsub.topic.v1.messagePublished on the audit topic (a Logging sink of Compute's
    System Event audit log): reconcile the job whose VM the entry names."""
    functions.on_audit(event.get_data() or {})


@functions_framework.cloud_event
def on_shard(event: CloudEvent) -> None:
    """google.cloud.pubsub.topic.v1.messagePublished on the shards' topic (RESPAWN_SHARDS > 1):
    reconcile the shard of the fleet the tick's message names, from the listing it carries."""
    functions.on_shard(event.get_data() or {})
