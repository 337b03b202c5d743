"""The VM agent as VMs get it: a small bootstrap in their metadata, the agent itself in the bucket.

Every listing of the fleet's instances returns their metadata, and the agent (startup.sh and
shutdown.sh with common.sh inlined, about 50 KB JSON-escaped) once went into every VM's. Now a VM
carries a bootstrap of a few KB (deploy/vm/startup-boot.sh, shutdown-boot.sh) and, for each script,
where it lies and its SHA-256 (``items``); the scripts lie in the control bucket under names of their
content's digest (``respawn/vm/<sha256>/startup.sh``), written by the controller before the first
insert of each process (``Shelf``). What a VM runs is decided by the digest in its metadata, which
only the controller writes: a bucket writer who replaces an object makes VMs run nothing, never
something else. The scripts ship with the controller's source and are never read from the bucket.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from controller.core import errors
from controller.core.ports import BlobStore

log = logging.getLogger(__name__)

PREFIX = "respawn/vm/"  # the trainer's account may read (never list, never write) what lies under it
COMMON_MARK = "# @@common.sh@@"
BOOT_MARK = "# @@boot.sh@@"
ROLES = ("startup", "shutdown")


@dataclass(frozen=True)
class Script:
    """One agent script as VMs fetch it: its bytes, and the digest that names them."""

    role: str  # "startup" | "shutdown"
    text: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text).hexdigest()

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.sha256}/{self.role}.sh"


@dataclass(frozen=True)
class VmScripts:
    startup: Script
    shutdown: Script
    startup_boot: str  # what VMs carry as their startup-script
    shutdown_boot: str  # ... and as their shutdown-script

    @property
    def scripts(self) -> tuple[Script, Script]:
        return self.startup, self.shutdown

    def items(self, bucket: str) -> dict[str, str]:
        """The metadata the bootstraps read: each script's gs:// URI and digest."""
        out: dict[str, str] = {}
        for s in self.scripts:
            out[f"respawn-{s.role}-script"] = f"gs://{bucket}/{s.key}"
            out[f"respawn-{s.role}-script-sha256"] = s.sha256
        return out


def agent(folder: Path) -> tuple[str, str]:
    """startup.sh and shutdown.sh, each with common.sh inlined: a VM needs only bash and curl."""
    try:
        common = (folder / "common.sh").read_text() if (folder / "common.sh").exists() else ""
        startup, shutdown = ((folder / f"{r}.sh").read_text() for r in ROLES)
    except OSError as e:
        raise errors.ConfigError(f"VM scripts not found under {folder}: {e}") from e
    return startup.replace(COMMON_MARK, common), shutdown.replace(COMMON_MARK, common)


def load(folder: Path) -> VmScripts:
    """The agent and its bootstraps from ``folder`` (the project's deploy/vm)."""
    startup, shutdown = agent(folder)
    try:
        boot = (folder / "boot.sh").read_text()
        startup_boot, shutdown_boot = ((folder / f"{r}-boot.sh").read_text().replace(BOOT_MARK, boot) for r in ROLES)
    except OSError as e:
        raise errors.ConfigError(f"VM bootstrap scripts not found under {folder}: {e}") from e
    return VmScripts(Script("startup", startup.encode()), Script("shutdown", shutdown.encode()),
                     _code(startup_boot), _code(shutdown_boot))


def _code(script: str) -> str:
    """A bootstrap without its comment lines (the shebang kept): every VM's metadata carries it, and
    its explanations live in deploy/vm. Safe there: no heredoc, no string spans lines."""
    first, _, rest = script.partition("\n")
    return "\n".join([first, *(line for line in rest.splitlines() if line.strip() and not line.lstrip().startswith("#"))]) + "\n"


class Shelf:
    """Puts the scripts in the bucket: ``ensure`` before every insert costs requests only once it
    has succeeded (one create each when absent; a 412 is read back), and then a stat of each script
    once every ``recheck`` seconds at most.

    A script found under its name with other bytes (a bucket writer replaced it) is written back:
    VMs would refuse it anyway (its digest), and this keeps them booting. Looked at again every
    ``recheck`` seconds by its generation (a stat each, no read while it is the one put): a warm
    function instance lives for hours, and a replacement it never looked at again failed every VM
    it launched meanwhile, each job within its max_failures, for a reason only the VMs' serial
    consoles said."""

    RECHECK = 60.0

    def __init__(self, store: BlobStore, bucket: str, scripts: VmScripts, recheck: float = RECHECK) -> None:
        self.store, self.bucket, self.scripts = store, bucket, scripts
        self.recheck = recheck
        self._lock = threading.Lock()
        self._checked: float | None = None  # time.monotonic() when every script was last found ours
        self._generations: dict[str, int] = {}  # each script's generation when last found ours

    def ensure(self) -> None:
        if self._fresh():
            return
        with self._lock:
            if self._fresh():
                return
            try:
                for script in self.scripts.scripts:
                    self._check(script)
            except errors.RespawnError as e:
                if self._checked is None:
                    raise  # never put by this process: no insert may point at them yet
                # Put once already, and most likely there still: a look that failed holds no insert.
                log.warning("could not look at the VM scripts again: %s: %s", type(e).__name__, e)
            self._checked = time.monotonic()

    def _fresh(self) -> bool:
        return self._checked is not None and time.monotonic() - self._checked < self.recheck

    def _check(self, script: Script) -> None:
        known = self._generations.get(script.key)
        if known is not None:
            try:
                if self.store.stat(self.bucket, script.key).generation == known:
                    return
            except errors.NotFound:
                pass  # deleted since: put again below
        self._generations[script.key] = self._put(script)

    def _put(self, script: Script) -> int:
        """The script in place; the generation it is there at."""
        where = f"gs://{self.bucket}/{script.key}"
        try:
            info = self.store.write(self.bucket, script.key, script.text, if_generation_match=0)
            log.info("VM %s script in place at %s", script.role, where)
            return info.generation
        except errors.PreconditionFailed:
            pass  # there already: an earlier process's (or this very write's first try, see GcsStore.write)
        # Read no more than the script's own size: a bucket writer's object under its name may be as
        # large as GCS allows, and read whole it would fill the function on its first insert.
        try:
            found = self.store.read(self.bucket, script.key, limit=len(script.text))
            if hashlib.sha256(found.data).hexdigest() == script.sha256:
                return found.info.generation
            generation = found.info.generation
        except errors.TooLarge:
            generation = self.store.stat(self.bucket, script.key).generation
        log.warning("%s holds other bytes than its name says (replaced by a bucket writer?): VMs refuse it; "
                    "writing the controller's script back", where)
        return self.store.write(self.bucket, script.key, script.text, if_generation_match=generation).generation
