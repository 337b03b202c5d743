"""A local "VM": the instance's startup-script run as a real process group.

Each instance gets its own working directory and metadata server. The process sees
``GCE_METADATA_HOST`` and ``STORAGE_EMULATOR_HOST`` (so the same VM scripts run here
and on GCP) and, first on its PATH, ``poweroff``/``shutdown`` shims: a guest powering
itself off simply ends the process, which the Compute server records as a guest
termination. Stopping the VM runs its shutdown-script within a time budget, then
kills the whole process group, as Compute's hard power-off does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

_SHIM = "#!/bin/sh\n# localcloud: a guest power-off ends the VM's process group (its own group: kill 0)\nkill -TERM 0\n"


class VmProcess:
    def __init__(self, workdir: Path, env: dict[str, str], on_exit: Callable[[int], None]) -> None:
        self.workdir = workdir
        self.env = env
        self._on_exit = on_exit
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = False
        bin_dir = workdir / ".bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name in ("poweroff", "shutdown", "halt"):
            shim = bin_dir / name
            shim.write_text(_SHIM)
            shim.chmod(0o755)
        # Every process of this VM inherits the tag, even one that leaves the process group
        # (the VM agent runs the trainer under setsid): power-off kills all that carry it.
        self.tag = f"{workdir.name}-{os.getpid()}-{id(self)}"
        self.env = {**env, "PATH": f"{bin_dir}:{env.get('PATH', os.environ.get('PATH', ''))}", "HOME": str(workdir),
                    "RESPAWN_LOCAL_VM": self.tag}

    def start(self, script: str) -> None:
        path = self.workdir / "startup-script"
        path.write_text(script)
        log = open(self.workdir / "serial-port-1.log", "ab")
        self._proc = subprocess.Popen(
            ["bash", str(path)], cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        threading.Thread(target=self._wait, name=f"vm-{self.workdir.name}", daemon=True).start()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, shutdown_script: str | None, budget: float) -> None:
        """Run the shutdown script (at most ``budget`` seconds), then hard power-off."""
        self._stopping = True
        deadline = time.monotonic() + budget
        if shutdown_script and self.running and budget > 0:
            path = self.workdir / "shutdown-script"
            path.write_text(shutdown_script)
            with open(self.workdir / "serial-port-1.log", "ab") as log:
                try:
                    subprocess.run(["bash", str(path)], cwd=self.workdir, env=self.env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=budget)
                except subprocess.TimeoutExpired:
                    pass
        self.kill(max(0.0, deadline - time.monotonic()))

    def kill(self, grace: float = 0.0) -> None:
        """Hard power-off: SIGTERM to every process of the VM, SIGKILL after ``grace``."""
        if self._proc is None:
            return
        deadline = time.monotonic() + grace
        self._signal_all(signal.SIGTERM)
        while self._pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def _signal_all(self, sig: int) -> None:
        for pid in self._pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _pids(self) -> list[int]:
        """Live processes carrying this VM's tag (zombies excluded)."""
        needle = f"RESPAWN_LOCAL_VM={self.tag}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0") and b") Z " not in (entry / "stat").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def _wait(self) -> None:
        assert self._proc is not None
        code = self._proc.wait()
        if not self._stopping:
            self._on_exit(code)
