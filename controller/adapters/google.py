"""Build the Google adapters from settings: real endpoints, or the local cloud's."""

from __future__ import annotations

from typing import Any

import requests
import requests.adapters
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from controller.adapters.compute import ComputeEngine, InstancesClient, ZoneOperationsClient
from controller.adapters.gcs import GcsStore
from controller.config import Settings


def gcs_store(config: Settings) -> GcsStore:
    # With STORAGE_EMULATOR_HOST set, the client talks to it with anonymous credentials.
    client = storage.Client(project=config.project)
    _pool(client._http, config.concurrency)
    return GcsStore(client)


def _pool(session: requests.Session, size: int) -> None:
    """As many kept-alive connections as a pass has threads (requests keeps 10 per host).

    Neither client exposes its session's pool: the storage maintainers' answer is to mount
    an adapter on ``client._http`` (googleapis/python-storage#253); Compute's REST transport
    keeps its session as ``_session``. Without it, each thread past the tenth opens and
    drops a connection per request, and urllib3 warns of it on every pass.
    """
    adapter = requests.adapters.HTTPAdapter(pool_connections=size, pool_maxsize=size)
    for scheme in ("https://", "http://"):
        session.mount(scheme, adapter)


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
    instances, operations = InstancesClient(**kwargs), ZoneOperationsClient(**kwargs)
    for client in (instances, operations):
        _pool(client._transport._session, config.concurrency)
    return ComputeEngine(instances, None, operations, operation_timeout=config.operation_wait)
