"""Wiring in one place: settings -> adapters -> engine, built lazily on first use.

Nothing is built at import time, so importing ``main`` costs nothing and tests can
install their own engine (over the fakes) with ``override``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from controller import errors, logs
from controller.clock import SystemClock
from controller.config import Settings
from controller.engine import Engine
from controller.executor import Executor
from controller.launch import LaunchContext
from controller.observe import Observer
from controller.ports import BlobStore, ComputeGateway, TpuGateway, TpuList, TpuRequest

_lock = threading.RLock()
COMMON_MARK = "# @@common.sh@@"
_engine: Engine | None = None
_settings: Settings | None = None
_adapters: tuple[BlobStore, ComputeGateway] | None = None


def settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = Settings()
        return _settings


def engine() -> Engine:
    """The process's engine, built on first use from the environment."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = build(settings())
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


def override(engine: Engine | None, config: Settings | None = None,
             store: BlobStore | None = None, compute: ComputeGateway | None = None) -> None:
    """Install (or, with None, forget) what the process uses; for tests and the local cloud."""
    global _engine, _settings, _adapters
    with _lock:
        _engine, _settings = engine, config
        _adapters = (store, compute) if store is not None and compute is not None else None


def build(config: Settings) -> Engine:
    logs.setup(cloud=config.cloud_logging)
    store, compute = adapters()
    ctx = launch_context(config)
    from controller.adapters.google import capacity_advisor  # built, not called: asked only at a launch

    tpu = LazyTpu(config)
    observer = Observer(store, compute, config.bucket, config.policy(), workers=config.concurrency,
                        advisor=capacity_advisor(config), tpu=tpu)
    return Engine(observer, Executor(store, compute, config.bucket, tpu), ctx, SystemClock(),
                  workers=config.concurrency, operation_wait=config.operation_wait)


class LazyTpu:
    """The TPU gateway, built on its first call: a controller whose bucket holds no TPU job
    never imports google-cloud-tpu, and its cold start does not pay for it."""

    def __init__(self, config: Settings) -> None:
        self._config = config
        self._gateway: TpuGateway | None = None
        self._lock = threading.Lock()

    def _built(self) -> TpuGateway:
        with self._lock:
            if self._gateway is None:
                try:
                    from controller.adapters.google import tpu_gateway

                    self._gateway = tpu_gateway(self._config)
                except Exception as e:  # noqa: BLE001 - no credentials, a broken install: TPU jobs wait, VM jobs go on
                    raise errors.ConfigError(f"cannot build the Cloud TPU client: {type(e).__name__}: {e}") from e
            return self._gateway

    def list_nodes(self, projects: Sequence[str], zones: Sequence[str], job: str | None = None) -> TpuList:
        return self._built().list_nodes(projects, zones, job)

    def create(self, request: TpuRequest, request_id: str, wait: float | None = None) -> None:
        self._built().create(request, request_id, wait)

    def delete(self, project: str, zone: str, name: str) -> None:
        self._built().delete(project, zone, name)


def launch_context(config: Settings) -> LaunchContext:
    """The VM scripts ship with the controller's own source, never from the bucket."""
    return LaunchContext(config.bucket, config.project, *vm_scripts(config.vm_scripts))


def vm_scripts(folder: Path) -> tuple[str, str]:
    """startup.sh and shutdown.sh, each with common.sh inlined: a VM needs only bash and curl."""
    try:
        common = (folder / "common.sh").read_text() if (folder / "common.sh").exists() else ""
        startup, shutdown = ((folder / n).read_text() for n in ("startup.sh", "shutdown.sh"))
    except OSError as e:
        raise errors.ConfigError(f"VM scripts not found under {folder}: {e}") from e
    return startup.replace(COMMON_MARK, common), shutdown.replace(COMMON_MARK, common)
