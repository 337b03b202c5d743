"""Cloud Functions entry points (2nd gen). Thin on purpose: see controller/service/functions.py."""

import functions_framework
from cloudevents.http import CloudEvent
from flask import Request

from controller.service import functions


@functions_framework.http
def tick(request: Request) -> tuple[dict, int]:
    """Cloud Scheduler, every minute (OIDC-authenticated): reconcile every job."""
    return functions.tick()


@functions_framework.cloud_event
def on_object(event: CloudEvent) -> None:
    """google.cloud.storage.object.v1.finalized on the bucket: reconcile that object's job."""
    functions.on_object(event.get_data() or {})
