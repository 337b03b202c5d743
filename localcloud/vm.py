"""A local "VM": the instance's startup-script run as a real process group.

Each instance gets its own working directory and metadata server. The process sees
``GCE_METADATA_HOST`` and ``STORAGE_EMULATOR_HOST`` (so the same VM scripts run here
and on GCP). As on Compute Engine, where the startup script is a oneshot systemd unit,
the VM keeps running (and, on Google, billing) after its startup script exits, whatever
its exit code: the guest agent only logs ``startup-script exit status N`` and "Finished
running startup scripts." to the serial port. What ends a VM is a power-off: the guest's
own (``poweroff``, ``halt`` or ``shutdown``, shims first on its PATH that ask Compute to
power it off: ``shutdown`` without a time waits a minute, as systemd's does), or Compute's
(stop, delete, preemption, a crash). Powering off runs the shutdown-script, within a time
budget when Compute imposes one, then kills every process of the VM, as Compute's hard
power-off does.

Each VM is its own container host too (an image: job's trainer runs in a container): podman with
the VM's own image store and container state under its folder (a fresh VM has no image until it
pulls one), the registries the local cloud serves (``CONTAINERS_REGISTRIES_CONF``, from the VM
environment), and every container of it carrying the VM's tag in its environment, so that the hard
power-off kills the container's processes with the rest; its containers are then removed, as a
VM's power-off ends them. The configuration is DESIGN.md's: runc, no default ulimits, cgroupfs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

POWEROFF_REQUEST = ".poweroff-request"

# poweroff / halt: ask for the power-off and return at once, as systemctl does; the guest
# goes on running until the shutdown kills it.
_POWEROFF = """#!/bin/sh
# localcloud: ask Compute to power this VM off (systemd queues the job and returns)
: > {request}
"""
# shutdown [OPTIONS] [TIME] [WALL...]: TIME is "now", "+m" or "hh:mm"; none means "+1";
# -c cancels a pending one, -k only writes the wall message.
_SHUTDOWN = """#!/bin/bash
# localcloud: systemd's shutdown, as far as timing goes
pending={pending}
delay=60 timed=""
for a in "$@"; do
  case "$a" in
    -c|--cancel) [ -f "$pending" ] && kill "$(cat "$pending")" 2>/dev/null; rm -f "$pending"; exit 0 ;;
    -k) exit 0 ;;
    -*) ;;
    *) [ -n "$timed" ] && continue; timed=1
       case "$a" in
         now) delay=0 ;;
         +[0-9]*) delay=$(( ${{a#+}} * 60 )) ;;
         [0-9]*:[0-9]*) t=$(date -d "$a" +%s) || exit 1; n=$(date +%s)
                        [ "$t" -ge "$n" ] || t=$((t + 86400)); delay=$((t - n)) ;;
         *) echo "Failed to parse time specification: $a" >&2; exit 1 ;;
       esac ;;
  esac
done
if [ "$delay" = 0 ]; then : > {request}; exit 0; fi
[ -f "$pending" ] && kill "$(cat "$pending")" 2>/dev/null
( sleep "$delay" && : > {request} ) >/dev/null 2>&1 &
echo $! > "$pending"
echo "Shutdown scheduled in $delay s, use 'shutdown -c' to cancel."
"""


_CONTAINERS_CONF = """[containers]
default_ulimits = []
env = ["RESPAWN_LOCAL_VM={tag}"]
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
"""
_STORAGE_CONF = """[storage]
driver = "overlay"
graphroot = "{root}"
runroot = "{run}"
"""


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder`` (/proc/self/mountinfo's fifth field, octal escapes undone)."""
    prefix = str(folder.resolve())
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return found


def unmount_under(folder: Path) -> None:
    """Whatever is mounted at or below ``folder`` unmounted, deepest first (lazily: a process still in it
    keeps it until it leaves)."""
    for point in sorted(mounts_under(folder), reverse=True):
        subprocess.run(["umount", "-l", point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)


class VmProcess:
    def __init__(self, workdir: Path, env: dict[str, str], on_power_off: Callable[[], None]) -> None:
        self.workdir = workdir
        self._on_power_off = on_power_off
        self._proc: subprocess.Popen[bytes] | None = None
        self._up = False
        self._stopping = threading.Event()
        bin_dir = workdir / ".bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        self._request = bin_dir / POWEROFF_REQUEST
        self._request.unlink(missing_ok=True)  # a request left from the VM's last run is no request
        (bin_dir / ".shutdown-pending").unlink(missing_ok=True)
        shims = {"poweroff": _POWEROFF, "halt": _POWEROFF, "shutdown": _SHUTDOWN}
        for name, text in shims.items():
            shim = bin_dir / name
            shim.write_text(text.format(request=shlex.quote(str(self._request)),
                                        pending=shlex.quote(str(bin_dir / ".shutdown-pending"))))
            shim.chmod(0o755)
        # Every process of this VM inherits the tag, even one that leaves the process group
        # (the VM agent runs the trainer under setsid): power-off kills all that carry it.
        self.tag = f"{workdir.name}-{os.getpid()}-{id(self)}"
        self.env = {**env, "PATH": f"{bin_dir}:{env.get('PATH', os.environ.get('PATH', ''))}", "HOME": str(workdir),
                    "RESPAWN_LOCAL_VM": self.tag, **self._container_host(workdir / ".containers")}

    def _container_host(self, folder: Path) -> dict[str, str]:
        """This VM's podman: its own configuration, image store and (per boot) container state."""
        self._containers = folder
        folder.mkdir(exist_ok=True)
        shutil.rmtree(folder / "run", ignore_errors=True)  # /run is a tmpfs: a boot starts with none
        (folder / "containers.conf").write_text(_CONTAINERS_CONF.format(tag=self.tag))
        (folder / "storage.conf").write_text(_STORAGE_CONF.format(root=folder / "storage", run=folder / "run"))
        return {"CONTAINERS_CONF": str(folder / "containers.conf"), "CONTAINERS_STORAGE_CONF": str(folder / "storage.conf")}

    def _remove_containers(self) -> None:
        """After the power-off: the VM's containers (their processes died with it) removed, their
        file systems unmounted, as nothing of them runs on a VM that is off."""
        podman = shutil.which("podman", path=self.env.get("PATH"))
        if podman is None or not (self._containers / "storage").exists():
            return
        try:
            subprocess.run([podman, "rm", "--all", "--force", "--time", "0"], env=self.env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
        # podman's overlay driver mounts its own folder (and a container's shm under the run folder): what
        # was mounted goes with the power-off, deepest first, so that the VM's folder can be removed.
        unmount_under(self._containers)

    def start(self, script: str | None) -> None:
        """Boot: run the startup script, if there is one (the VM runs on either way)."""
        self._up = True
        if not script:
            with open(self.workdir / "serial-port-1.log", "ab") as log:
                log.write(b"google_metadata_script_runner: No startup scripts to run.\n")
            return
        path = self.workdir / "startup-script"
        path.write_text(script)
        log = open(self.workdir / "serial-port-1.log", "ab")
        self._proc = subprocess.Popen(
            ["bash", str(path)], cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        log.close()
        threading.Thread(target=self._script_ended, name=f"vm-{self.workdir.name}", daemon=True).start()
        threading.Thread(target=self._watch_power, name=f"vm-power-{self.workdir.name}", daemon=True).start()

    @property
    def up(self) -> bool:
        """Powered on: started, and not yet powered off (the startup script may have ended)."""
        return self._up

    @property
    def running(self) -> bool:
        """The startup script is still running."""
        return self._proc is not None and self._proc.poll() is None

    def stop(self, shutdown_script: str | None, budget: float, notice: float | None = None) -> None:
        """Run the shutdown script (at most ``budget`` seconds), then hard power-off.

        ``notice``: the deadline Compute imposes, told to the shutdown script as
        ``RESPAWN_NOTICE_SECONDS`` (seconds, at most three decimals: "30", "0.5"); ``None``
        when there is none (a shutdown the guest asked for): the variable is then unset."""
        self._stopping.set()
        deadline = time.monotonic() + budget
        if shutdown_script and self._up and budget > 0:
            path = self.workdir / "shutdown-script"
            path.write_text(shutdown_script)
            env = dict(self.env)
            if notice is not None:
                env["RESPAWN_NOTICE_SECONDS"] = f"{max(0.0, notice):.3f}".rstrip("0").rstrip(".")
            with open(self.workdir / "serial-port-1.log", "ab") as log:
                try:
                    subprocess.run(["bash", str(path)], cwd=self.workdir, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=budget)
                except subprocess.TimeoutExpired:
                    pass
        self.kill(max(0.0, deadline - time.monotonic()))

    def kill(self, grace: float = 0.0) -> None:
        """Hard power-off: SIGTERM to every process of the VM, SIGKILL after ``grace``."""
        self._stopping.set()
        self._up = False
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
        self._remove_containers()

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

    def _script_ended(self) -> None:
        """The startup script ended: the guest agent logs it; the VM runs on."""
        assert self._proc is not None
        code = self._proc.wait()
        if self._stopping.is_set():
            return
        if code == 0:
            line = "startup-script exit status 0"
        else:
            why = f"signal: {signal.strsignal(-code).lower()}" if code < 0 else f"exit status {code}"
            line = f'Script "startup-script" failed with error: {why}'
        with open(self.workdir / "serial-port-1.log", "ab") as log:
            log.write(f"google_metadata_script_runner: {line}\n"
                      f"google_metadata_script_runner: Finished running startup scripts.\n".encode())

    def _watch_power(self) -> None:
        while not self._stopping.wait(0.05):
            if self._request.exists():
                self._on_power_off()
                return
