"""Build the Google adapters from settings: real endpoints, or the local cloud's."""

from __future__ import annotations

from typing import Any

from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from controller.adapters.compute import ComputeEngine, InstancesClient, ZoneOperationsClient
from controller.adapters.gcs import GcsStore
from controller.config import Settings


def gcs_store(config: Settings) -> GcsStore:
    # With STORAGE_EMULATOR_HOST set, the client talks to it with anonymous credentials.
    return GcsStore(storage.Client(project=config.project))


def _client_args(config: Settings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"transport": "rest"}
    if config.compute_endpoint:  # the local cloud: no Google credentials anywhere
        kwargs.update(client_options=ClientOptions(api_endpoint=config.compute_endpoint),
                      credentials=AnonymousCredentials())
    return kwargs


def instances_client(config: Settings) -> InstancesClient:
    return InstancesClient(**_client_args(config))


def compute_gateway(config: Settings) -> ComputeEngine:
    kwargs = _client_args(config)
    return ComputeEngine(InstancesClient(**kwargs), None, ZoneOperationsClient(**kwargs),
                         operation_timeout=config.operation_wait)
