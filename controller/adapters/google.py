"""Build the Google adapters from settings: real endpoints, or the local cloud's."""

from __future__ import annotations

import os
import urllib.request
from typing import TYPE_CHECKING, Any

import requests
import requests.adapters
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from controller.adapters import failfast
from controller.adapters import compute
from controller.adapters.compute import ComputeEngine, Listing
from controller.adapters.gcs import GcsStore
from controller.service.config import Settings

if TYPE_CHECKING:
    from google.cloud.compute_v1.services.instances import InstancesClient

    from controller.adapters.advice import ComputeAdvice
    from controller.adapters.quotas import ComputeQuotas
    from controller.adapters.tpu import CloudTpu
    from controller.adapters.tpu_compute import ComputeTpu


def gcs_store(config: Settings) -> GcsStore:
    # With STORAGE_EMULATOR_HOST set, the client talks to it with anonymous credentials.
    client = storage.Client(project=config.project)
    _tune(client._http, config.concurrency)
    return GcsStore(client)


def _tune(session: requests.Session, size: int) -> None:
    """As many kept-alive connections as a pass has threads (requests keeps 10 per host), and
    the environment read once rather than on every request.

    Neither client exposes its session's pool: the storage maintainers' answer is to mount
    an adapter on ``client._http`` (googleapis/python-storage#253); Compute's REST transport
    keeps its session as ``_session``. Without it, each thread past the tenth opens and
    drops a connection per request, and urllib3 warns of it on every pass.

    requests looks for proxies, CA bundles and a netrc file in the environment on every
    request (``Session.merge_environment_settings``: a tenth of a pass's CPU, py-spy on the
    tick function). Where it holds no proxy and no netrc, as in a Cloud Function, the lookup
    is turned off and a CA bundle it names is taken once; where it holds either, it stays on.
    """
    _mount(session, failfast.adapter(size) if failfast.enabled() else
           requests.adapters.HTTPAdapter(pool_connections=size, pool_maxsize=size))
    if urllib.request.getproxies() or os.environ.get("NETRC") or any(
            os.path.exists(os.path.expanduser(f)) for f in ("~/.netrc", "~/_netrc")):
        return  # requests goes on reading the environment per request, as it would
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle and session.verify is True:
        session.verify = bundle  # what requests would take from the environment, taken once
    session.trust_env = False


def _client_args(config: Settings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"transport": "rest"}
    if config.compute_endpoint:  # the local cloud: no Google credentials anywhere
        kwargs.update(client_options=ClientOptions(api_endpoint=config.compute_endpoint),
                      credentials=AnonymousCredentials())
    return kwargs


def instances_client(config: Settings) -> InstancesClient:
    client = compute.instances_client(**_client_args(config))
    _fail_fast(client._transport._session)
    return client


def _fail_fast(session: Any) -> None:
    """At a terminal (``failfast.enabled()``), a client ``_tune`` leaves alone fails fast too."""
    if failfast.enabled() and session is not None:
        _mount(session, failfast.adapter(10))


def _mount(session: requests.Session, adapter: requests.adapters.HTTPAdapter) -> None:
    """``adapter`` for both schemes, where the session has requests' own (never a client's mTLS adapter)."""
    for scheme in ("https://", "http://"):
        if type(session.adapters.get(scheme)) is requests.adapters.HTTPAdapter:
            session.mount(scheme, adapter)


def capacity_advisor(config: Settings) -> ComputeAdvice:
    from controller.adapters.advice import AdviceClient, ComputeAdvice  # asked only at a launch

    client = AdviceClient(**_client_args(config))
    _tune(client._transport._session, config.concurrency)
    return ComputeAdvice(client)


def quota_reader(config: Settings) -> ComputeQuotas:
    """Compute's regional quotas (``regions.get``), for the CLI."""
    from controller.adapters.quotas import ComputeQuotas, RegionsClient

    client = RegionsClient(**_client_args(config))
    _fail_fast(getattr(client._transport, "_session", None))
    return ComputeQuotas(client)


def compute_gateway(config: Settings) -> ComputeEngine:
    """Listings on an AuthorizedSession of the credentials the clients get too (one lookup of
    them), the v1 clients built at the first change (``compute.ComputeEngine``)."""
    from google.auth.transport.requests import AuthorizedSession

    kwargs = _client_args(config)
    if "credentials" not in kwargs:  # as the clients' transport finds them (google.auth.default)
        import google.auth

        kwargs["credentials"], _ = google.auth.default(default_scopes=_COMPUTE_SCOPES)
    session = AuthorizedSession(kwargs["credentials"])
    _tune(session, config.concurrency)

    def clients() -> tuple[Any, Any]:
        built = compute.clients(**kwargs)
        for client in built:
            _tune(client._transport._session, config.concurrency)
        return built

    return ComputeEngine(Listing(session, config.compute_endpoint or _COMPUTE_HOST), clients,
                         operation_timeout=config.operation_wait, beta=lambda: beta_instances_client(config, kwargs))


# What google-cloud-compute's transports use: DEFAULT_HOST and AUTH_SCOPES (transports/base.py).
_COMPUTE_HOST = "compute.googleapis.com"
_COMPUTE_SCOPES = ("https://www.googleapis.com/auth/compute", "https://www.googleapis.com/auth/cloud-platform")


def beta_instances_client(config: Settings, kwargs: dict[str, Any] | None = None) -> Any:
    """google-cloud-compute-v1beta's InstancesClient, beside the v1 ones (same endpoint,
    credentials and transport: ``kwargs``, the v1 clients' own): the inserts that ask for a
    preemption notice. Imported here, at the first such insert, not at the top: a pass that asks
    for none never pays for it."""
    from controller.adapters.compute_beta import InstancesClient as BetaInstancesClient

    client = BetaInstancesClient(**(kwargs or _client_args(config)))
    _tune(client._transport._session, config.concurrency)
    return client


def logging_client(config: Settings) -> Any:
    """A google-cloud-logging client (what ``respawn logs`` reads), at the local cloud's Logging
    server when ``logging_endpoint`` is set: over REST (the server speaks no gRPC), no credentials."""
    from google.cloud import logging as cloud_logging

    class Reader(cloud_logging.Client):  # type: ignore[misc,valid-type]
        """Each entry listed gets a Logger, whose constructor, given no resource, asks the metadata
        server (twice, 5 s timeout each) which resource this machine is: a reader writes nothing,
        and a laptop has no metadata server. Asked once per log name and list call, it was most
        of a ``--follow`` read's time."""

        def logger(self, name: str, *, labels: Any = None, resource: Any = None) -> Any:
            return super().logger(name, labels=labels, resource=resource or cloud_logging.Resource(type="global",
                                                                                                  labels={}))

    if config.logging_endpoint:
        reader = Reader(project=config.project, credentials=AnonymousCredentials(), _use_grpc=False,
                        client_options=ClientOptions(api_endpoint=config.logging_endpoint))
    else:
        reader = Reader(project=config.project)
    if failfast.enabled():
        _fail_fast(getattr(reader, "_http", None))  # made now (it is made on first use otherwise)
    return reader


def tpu_gateway(config: Settings) -> CloudTpu:
    """The TPU port on ``tpu_v2.TpuClient`` (REST), at the local cloud's TPU server when
    ``tpu_endpoint`` is set. Imported here, not at the top: a function that never creates a
    TPU does not pay for the client's import on its cold start."""
    from google.cloud import tpu_v2

    from controller.adapters.tpu import CloudTpu
    from controller.adapters.tpu_compute import ComputeTpu

    kwargs: dict[str, Any] = {"transport": "rest"}
    if config.tpu_endpoint:  # the local cloud: no Google credentials anywhere
        kwargs.update(client_options=ClientOptions(api_endpoint=config.tpu_endpoint),
                      credentials=AnonymousCredentials())
    client = tpu_v2.TpuClient(**kwargs)
    if (session := getattr(client._transport, "_session", None)) is not None:
        _tune(session, config.concurrency)
    return CloudTpu(client, operation_timeout=config.operation_wait)


def compute_tpu_gateway(config: Settings) -> ComputeTpu:
    """The TPU port for TPU slices in Compute Engine (``tpu_compute.ComputeTpu``: instances, instance
    templates, workload policies, MIGs), on google-cloud-compute's clients at Compute's endpoint (the
    local cloud's when ``compute_endpoint`` is set), built at its first call."""
    from controller.adapters import tpu_compute

    kwargs = _client_args(config)

    def clients() -> tpu_compute.Clients:
        built = tpu_compute.clients(**kwargs)
        for client in vars(built).values():
            if (session := getattr(client._transport, "_session", None)) is not None:
                _tune(session, config.concurrency)
        return built

    return tpu_compute.ComputeTpu(clients, operation_timeout=config.operation_wait)
