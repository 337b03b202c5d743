"""Wiring in one place: settings -> adapters -> engine, built lazily on first use.

Nothing is built at import time, so importing ``main`` costs nothing and tests can
install their own engine (over the fakes) with ``override``.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from controller.core import errors
from controller.service import collector, logs, vmscripts
from controller.core.clock import SystemClock
from controller.service.config import Settings
from controller.service.engine import Engine
from controller.service.executor import Executor
from controller.core.launch import LaunchContext
from controller.service.lease import Leases
from controller.service.notifier import Notifier
from controller.service.observe import Observer
from controller.core.ports import (BlobStore, CapacityAdvisor, ComputeGateway, Publisher, Shape, TpuGateway, TpuList,
                                   TpuRequest, Webhook, ZoneAdvice)

_lock = threading.RLock()
_engine: Engine | None = None
_settings: Settings | None = None
_adapters: tuple[BlobStore, ComputeGateway] | None = None
_publisher: Publisher | None = None


def settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = Settings()
        return _settings


def engine() -> Engine:
    """The process's engine, built on first use from the environment.

    Built with the cyclic collector paused (the Compute client's import defines thousands of
    classes: collections then were a tenth of a cold start's CPU), then everything built so far
    (modules, classes, clients: never garbage) frozen out of every later collection, and the
    collector tuned (controller.service.collector): this is a function's process, built once."""
    global _engine
    with _lock:
        if _engine is None:
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                _engine = build(settings())
            finally:
                if was_enabled:
                    gc.enable()
            gc.freeze()
            collector.tune()
        return _engine


def adapters() -> tuple[BlobStore, ComputeGateway]:
    """The store and the gateway alone (the CLI's status, submit, cancel need no VM scripts)."""
    global _adapters
    with _lock:
        if _adapters is None:
            config = settings()
            if not config.bucket or not config.project:
                raise errors.ConfigError("set RESPAWN_BUCKET and RESPAWN_PROJECT (or GOOGLE_CLOUD_PROJECT)")
            from controller.adapters.google import compute_gateway, gcs_store  # heavy: only when needed

            _adapters = (gcs_store(config), compute_gateway(config))
        return _adapters


def publisher() -> Publisher:
    """The Pub/Sub publisher the tick publishes shard messages with (built on its first publish)."""
    global _publisher
    with _lock:
        if _publisher is None:
            _publisher = LazyPublisher(settings())
        return _publisher


def override(engine: Engine | None, config: Settings | None = None,
             store: BlobStore | None = None, compute: ComputeGateway | None = None,
             publisher: Publisher | None = None) -> None:
    """Install (or, with None, forget) what the process uses; for tests and the local cloud."""
    global _engine, _settings, _adapters, _publisher
    with _lock:
        _engine, _settings, _publisher = engine, config, publisher
        _adapters = (store, compute) if store is not None and compute is not None else None


def build(config: Settings) -> Engine:
    logs.setup(cloud=config.cloud_logging)
    store, compute = adapters()
    scripts = vmscripts.load(config.vm_scripts)
    ctx = launch_context(config, scripts)
    tpu, slices = LazyTpu(config), LazyTpu(config, api="compute")
    policy = config.policy()
    observer = Observer(store, compute, config.bucket, policy, workers=config.concurrency,
                        advisor=LazyAdvisor(config), tpu=tpu, snapshot=True, slices=slices)
    notifier = Notifier(policy, LazyPublisher(config), LazyWebhook(), wait=config.notify_wait)
    clock = SystemClock()
    executor = Executor(store, compute, config.bucket, tpu, notifier, shelf=vmscripts.Shelf(store, config.bucket, scripts),
                        written=observer.remember, slices=slices)
    return Engine(observer, executor, ctx, clock, workers=config.concurrency, operation_wait=config.operation_wait,
                  lease=Leases(store, config.bucket, clock, config.lease_terms()))


T = TypeVar("T")


class _Once(Generic[T]):
    """A client built on its first use, once, whichever thread asks first: a controller that
    never needs it (no TPU job, no notification destination) never imports its library, and
    its cold start does not pay for it. A client that cannot be built is a ConfigError: the
    jobs that need it wait or go without, the others go on."""

    def __init__(self, what: str, build: Callable[[], T]) -> None:
        self._what, self._build = what, build
        self._built: T | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            if self._built is None:
                try:
                    self._built = self._build()
                except Exception as e:  # noqa: BLE001 - no credentials, a broken install
                    raise errors.ConfigError(f"cannot build the {self._what} client: {type(e).__name__}: {e}") from e
            return self._built


class LazyAdvisor:
    """Compute's capacity advice, its client built at the first launch that asks for it: the
    client imports google-cloud-compute's message types, which a pass that launches nothing
    never needs (controller.adapters.compute)."""

    def __init__(self, config: Settings) -> None:
        def build() -> CapacityAdvisor:
            from controller.adapters.google import capacity_advisor

            return capacity_advisor(config)

        self._built = _Once[CapacityAdvisor]("Compute capacity advice", build)

    def advise(self, shape: Shape) -> dict[str, ZoneAdvice]:
        return self._built().advise(shape)


class LazyTpu:
    """A TPU gateway, built on its first call: the Cloud TPU API's (``api`` "tpu"), or Compute
    Engine's TPU slices ("compute")."""

    def __init__(self, config: Settings, api: str = "tpu") -> None:
        def build() -> TpuGateway:
            from controller.adapters import google

            return google.tpu_gateway(config) if api == "tpu" else google.compute_tpu_gateway(config)

        self._built = _Once[TpuGateway]("Cloud TPU" if api == "tpu" else "Compute Engine TPU slices", build)

    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        return self._built().list_nodes(projects, zones, job)

    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        self._built().create(request, request_id, wait)

    def delete(self, project: str, zone: str, name: str) -> None:
        self._built().delete(project, zone, name)


class LazyPublisher:
    """The Pub/Sub publisher, built on the first notification to a topic."""

    def __init__(self, config: Settings) -> None:
        def build() -> Publisher:
            from controller.adapters.pubsub import cloud_publisher

            return cloud_publisher(config.pubsub_endpoint)

        self._built = _Once[Publisher]("Pub/Sub", build)

    def publish(self, topic: str, data: bytes, attributes: Mapping[str, str]) -> str:
        return self._built().publish(topic, data, attributes)


class LazyWebhook:
    """The webhook client, built on the first notification to a webhook."""

    def __init__(self) -> None:
        def build() -> Webhook:
            from controller.adapters.webhook import HttpWebhook

            return HttpWebhook()

        self._built = _Once[Webhook]("webhook", build)

    def post(self, url: str, body: Mapping[str, object]) -> None:
        self._built().post(url, body)


def launch_context(config: Settings, scripts: vmscripts.VmScripts | None = None) -> LaunchContext:
    """The VM scripts ship with the controller's own source, never from the bucket: VMs carry the
    bootstraps, and where the agent's scripts lie with their digests (controller.service.vmscripts)."""
    scripts = scripts or vmscripts.load(config.vm_scripts)
    return LaunchContext(config.bucket, config.project, scripts.startup_boot, scripts.shutdown_boot,
                         script_items=tuple(scripts.items(config.bucket).items()))


def vm_scripts(folder: Path) -> tuple[str, str]:
    """The agent's startup.sh and shutdown.sh, each with common.sh inlined (what the bucket holds)."""
    return vmscripts.agent(folder)
