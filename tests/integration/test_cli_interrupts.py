"""Ctrl-C and a cloud that is not there, as a user meets them at a terminal (issue 26, items 1 and 2).

Ctrl-C reaches the whole foreground process group: ``respawn demo`` (or ``local up``) and every
process it started in that group. It must stop the command and everything it started (servers,
function processes, VM processes) within seconds, with one line and exit 130, never a traceback.
``respawn status`` against an endpoint where nothing listens answers in seconds, in one short line
that names the endpoint.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.wait import stop_gently

INTERRUPTED = "interrupted: the local cloud is stopped"


def _children(pid: int) -> set[tuple[int, bytes]]:
    """Every live descendant of ``pid``, as (pid, start time) so that a reused pid is not taken for it."""
    parents: dict[int, list[tuple[int, bytes]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if fields[0] == b"Z":
            continue
        parents.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found: set[tuple[int, bytes]] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child[0])
    return found


def _alive(process: tuple[int, bytes]) -> bool:
    try:
        stat = Path(f"/proc/{process[0]}/stat").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rindex(b")") + 2:].split()
    return fields[0] != b"Z" and fields[19] == process[1]


def _vm_processes(pid: int) -> list[int]:
    """Processes of the local cloud's VMs started by ``pid`` (each carries RESPAWN_LOCAL_VM=<vm>-<pid>-…)."""
    needle = f"-{pid}-".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        if b") Z " in stat:
            continue
        if any(v.startswith(b"RESPAWN_LOCAL_VM=") and needle in v for v in environ):
            found.append(int(entry.name))
    return found


def _interrupted(args: list[str], until: str, *, to_group: bool, ignored: bool = False, settle: float = 0.5,
                 env: dict[str, str] | None = None) -> tuple[int, str, float, set[tuple[int, bytes]], int]:
    """Start ``respawn ARGS`` in a process group of its own, wait for a line holding ``until``, then
    SIGINT (to its group: Ctrl-C; or to it alone). ``ignored``: started with SIGINT ignored, as a
    shell's background job is. Returns (exit code, output after the signal, seconds it took to end,
    what it had started, its pid)."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    process = subprocess.Popen([sys.executable, "-m", "controller.cli", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env={**shell, "COLUMNS": "200", **(env or {})},
                               stdin=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None)
    lines: list[str] = []
    seen = threading.Event()
    count = [0]

    def read() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if until in line:
                seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not seen.wait(120) or process.poll() is not None:
            pytest.fail(f"respawn {' '.join(args)} ended before {until!r}: " + "".join(lines)[-3000:])
        time.sleep(settle)
        started = _children(process.pid)
        count[0] = len(lines)
        sent = time.monotonic()
        if to_group:
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = -999
        took = time.monotonic() - sent
        reader.join(timeout=5)
        return code, "".join(lines[count[0]:]), took, started, process.pid
    finally:
        stop_gently(process)


def _nothing_left(started: set[tuple[int, bytes]], pid: int) -> None:
    deadline = time.monotonic() + 2  # a process killed a moment ago may not be reaped yet
    while (left := [p for p, _ in started if _alive((p, _))] + _vm_processes(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = []
    for p in left:
        try:
            described.append(f"{p}: {Path(f'/proc/{p}/cmdline').read_bytes().replace(bytes(1), b' ')[:200]!r}")
        except OSError:
            pass
    assert not described, described


@pytest.mark.parametrize("to_group, ignored", [(True, False), (False, True)], ids=["ctrl-c", "background-job"])
def test_ctrl_c_stops_the_demo_and_all_it_started_with_one_line_and_exit_130(tmp_path, to_group, ignored):
    """Ctrl-C (SIGINT to the process group, whose servers get it too), or SIGINT to a demo started as
    a background job (SIGINT inherited ignored): the demo ends in 2 seconds (5 here, for a loaded
    machine), exit 130, one line, no traceback, and no process it started left running."""
    code, output, took, started, pid = _interrupted(["demo", "--output", str(tmp_path)], "preempting demo-1",
                                                   to_group=to_group, ignored=ignored)
    assert code == 130, output[-3000:]
    assert took < 5, (took, output[-3000:])
    assert "Traceback" not in output and "Error" not in output, output[-3000:]
    said = [line for line in output.splitlines() if line.strip()]
    assert said[-1:] == [INTERRUPTED], output[-3000:]
    assert len(said) <= 2, output  # the line, and at most one line of the story said as the signal came
    assert started, "the demo had started no process?"
    _nothing_left(started, pid)


def test_ctrl_c_stops_local_up_with_a_job_running_without_a_traceback(tmp_path):
    """`respawn local up` with a job's VM training: Ctrl-C stops the servers, functions and VM,
    prints no traceback, and exits 0 ("local cloud stopped")."""
    folder = tmp_path / "local"
    spec = tmp_path / "mine.yaml"
    from controller.service.config import REPO_ROOT

    spec.write_text("zones: [us-central1-a]\nmachine_type: g2-standard-8\n"
                    f"command: python {REPO_ROOT}/examples/trainer.py\n"
                    'env: {TRAIN_STEPS: "100000", CHECKPOINT_EVERY: "30", STEP_SECONDS: "0.05"}\n'
                    "checkpoint: {uri: gs://respawn-local/checkpoints/mine}\n")
    done: dict[str, object] = {}

    def submit_when_up() -> None:  # in "another terminal", once local.env is there
        env_file = folder / "local.env"
        deadline = time.monotonic() + 120
        while not env_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        exports = dict(line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines()
                       if line.startswith("export "))
        shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
        env = {**shell, **{k: v.strip("'\"") for k, v in exports.items()}}
        done["submit"] = subprocess.run([sys.executable, "-m", "controller.cli", "submit", str(spec)], env=env,
                                        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    threading.Thread(target=submit_when_up, daemon=True).start()
    code, output, took, started, pid = _interrupted(
        ["local", "up", "--tick", "1", "--preemption-notice", "2", "--dir", str(folder)],
        "create mine-1 in us-central1-a: done", to_group=True, settle=3)
    assert code == 0, (done, output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    assert "local cloud stopped" in output
    assert took < 10, (took, output[-3000:])
    _nothing_left(started, pid)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_status_against_an_endpoint_nobody_listens_on_answers_in_seconds_naming_it():
    """Connection refused is no transient trouble to retry for two minutes at a terminal: one short
    line, in seconds, that names the endpoint and what to do."""
    endpoint = f"http://127.0.0.1:{_free_port()}"
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    env = {**shell, "COLUMNS": "200", "STORAGE_EMULATOR_HOST": endpoint, "RESPAWN_BUCKET": "respawn-local",
           "RESPAWN_PROJECT": "respawn-local", "RESPAWN_COMPUTE_ENDPOINT": f"http://127.0.0.1:{_free_port()}"}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "controller.cli", "status"], env=env, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    took = time.monotonic() - began
    text = done.stdout + done.stderr
    assert took < 10, (took, text)
    assert done.returncode == 3, text  # UNAVAILABLE: the same command may work once the endpoint is up
    said = [line for line in text.splitlines() if line.strip()]
    assert len(said) == 1 and len(said[0]) <= 200, text
    assert endpoint in said[0] and "STORAGE_EMULATOR_HOST" in said[0], text
    assert "Traceback" not in text


def test_an_unreachable_endpoint_is_named_with_the_variable_that_set_it(monkeypatch):
    from controller.adapters import failfast

    monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", "http://compute.example.invalid:8080")
    said = str(failfast.unreachable("http://compute.example.invalid:8080/compute/v1/projects/p", "no such host"))
    assert said == ("cannot connect to http://compute.example.invalid:8080 (no such host; set by "
                    "RESPAWN_COMPUTE_ENDPOINT): check that variable and the network")
    said = str(failfast.unreachable("https://storage.googleapis.com/storage/v1/b/x", "connection refused"))
    assert said == "cannot connect to https://storage.googleapis.com (connection refused): check the network"
    # A connect is bounded whatever timeout the client asked for; the read keeps its own.
    assert failfast._bounded(None) == (failfast.CONNECT_TIMEOUT, None)
    assert failfast._bounded(60) == (failfast.CONNECT_TIMEOUT, 60)
    assert failfast._bounded((120, 30)) == (failfast.CONNECT_TIMEOUT, 30)


class _Busy:
    """An HTTP server on 127.0.0.1 that answers every request 503, forever."""

    def __enter__(self) -> str:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PUT = do_DELETE = answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("command", [["status"], ["report", "j"], ["cancel", "j"]])
def test_a_command_against_an_endpoint_that_answers_503_forever_gives_up_at_its_bound_in_one_line(command):
    """A 5xx is retried by the clients for minutes (120 s for storage): at a terminal, the command's
    --timeout (RESPAWN_TIMEOUT) bounds it all, with one line naming the endpoint and exit 3."""
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    with _Busy() as endpoint:
        env = {**shell, "COLUMNS": "200", "STORAGE_EMULATOR_HOST": endpoint, "RESPAWN_BUCKET": "respawn-local",
               "RESPAWN_PROJECT": "respawn-local", "RESPAWN_COMPUTE_ENDPOINT": endpoint, "RESPAWN_TIMEOUT": "4"}
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "controller.cli", *command], env=env, capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
    took = time.monotonic() - began
    text = done.stdout + done.stderr
    assert took < 4 + 5, (took, text)
    assert done.returncode == 3, text
    said = [line for line in text.splitlines() if line.strip()]
    assert len(said) == 1, text
    assert said[0].startswith("✗ gave up after 4 s: ") and endpoint in said[0] and "503" in said[0], text
    assert "--timeout" in said[0] and "Traceback" not in text


def test_the_bound_is_the_cli_s_alone_and_ends_with_the_command():
    """The functions keep their own retries: nothing bounds a process that did not start a CLI command,
    and a command, once done, leaves no timer armed nor requests refused behind it."""
    from typer.testing import CliRunner

    from controller.adapters import failfast
    from controller.cli.main import app

    assert failfast._stop_at is None  # a function's requests are never refused for time
    handler, left = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)[0]
    spec = Path(__file__).parents[2] / "examples" / "llm-finetune.yaml"
    result = CliRunner().invoke(app, ["--timeout", "7", "validate", str(spec)])
    assert result.exit_code == 0 and "valid" in result.output, result.output
    # pytest-timeout's own alarm (if any) is back, never pushed later
    assert failfast._stop_at is None and signal.getsignal(signal.SIGALRM) is handler
    now = signal.getitimer(signal.ITIMER_REAL)[0]
    assert now <= left and (left == 0) == (now == 0)
