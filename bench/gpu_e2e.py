"""The Hugging Face example on a GPU, preempted under the local cloud: does the kit lose nothing?

``python -m bench.gpu_e2e`` (by hand, where a GPU is; never run by ``make test``; ``--device cpu`` runs the
same story slowly on a CPU with a tiny model). It needs the frameworks ``make test-frameworks`` installs.

1. **Uninterrupted**: ``examples/hf-finetune/train.py`` alone, ``--deterministic``, every step's loss into a
   loss log (JSON lines), and the final weights' digest.
2. **Under the local cloud** (``localcloud.stack.LocalCloud``: the functions, Compute with real VM
   processes running respawn's VM agent, GCS), the same command submitted as the job ``gpu-e2e`` from the
   example's own ``spec.yaml``, its code the repository packed as ``respawn submit --workdir .`` packs it
   (the spec's ``pip install`` dropped: the VMs are processes of this machine, with its frameworks).
   Attempt 1 is **preempted with Google's 120 s notice** (the spec's ``preemption_notice: 120s``; it lasts
   ``--notice-s`` here, 120 s on a GPU): ``instance/preempted`` turns TRUE, the agent writes its notice record
   and the notice file, the controller boots attempt 2 beside it (a standby, held at the starting line), the
   kit saves at the next step boundary and trains on; at the soft-off SIGTERM, the kit's final save, the
   marker, and the go: attempt 2 starts from that save. Attempt 2 is preempted **hard** (no notice, as when
   Google gives none: ``scale_notice(0)``; no shutdown script) half-way between two periodic saves; attempt 3
   finishes.

Checks (exit 1 if any fails): the job SUCCEEDED after 2 preemptions; every step any attempt trained has the
uninterrupted run's loss, bit for bit, and every step was trained; the final weights are the uninterrupted
run's; attempt 2 was booted at the notice, by the notice record, before the soft-off; the kit saved at the
notice; the notice preemption lost 0 steps, and its SIGTERM save (SIGTERM to ``trainer_state.json``
uploaded) landed within Spot's 30 s less the shutdown script's margin. Printed: steps lost per preemption,
the SIGTERM save's duration (and the kit's write/upload split), each recovery's **downtime** (from the
time the loss log gives the step the next attempt resumed from to the next attempt's first step) and its
time from the preemption (the notice) to that first step.

The SIGTERM save's duration runs from the SIGTERM to its ``trainer_state.json`` in the bucket: the
Trainer's own write, the kit's snapshot and the upload. The kit's "write" figure for a Hugging Face save is
only its snapshot (hard links) of the folder the Trainer already wrote.

**Not yet run on CUDA**, the notice's version nor the one before it: no GPU was available in the sessions
that wrote them. A CUDA run must be
deterministic to pass (``--deterministic``: the Trainer's ``full_determinism``, eager attention,
``CUBLAS_WORKSPACE_CONFIG``; bf16 autocast where supported). The run must outlast the notice: the
trainer has to be training at the soft-off, ``--notice-s`` after the notice; the uninterrupted run's step
time tells whether ``--steps`` are enough (else it stops and says how many). With ``--device cpu`` (2 shared
cores, a 2-layer 64-wide GPT-2, 150 steps, a save every 10, the notice lasting 6 s) it passed every check in
about 100 s: attempt 2 was inserted 0.3 s after the notice, the kit saved step 15 at the notice and trained
on to step 58, whose SIGTERM save took 0.38 s; the go came 3.3 s after it and attempt 2's first step 8.8 s
after the go (the trainer's start: imports, the checkpoint's download): 0 steps lost, a downtime of 12.5 s;
the hard preemption lost 5 steps (65 reached, 60 resumed), a downtime of 15.7 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from controller.cli import pack
from controller.core import names
from controller.core.state import JobStatus, Phase
from controller.service.config import REPO_ROOT
from localcloud.stack import LocalCloud, Options

JOB = "gpu-e2e"
NOTICE_S = 120.0  # Google's preemption notice (scheduling.preemptionNoticeDuration), asked for by the spec
SHUTDOWN_S = 30.0  # Spot's: the soft-off to the hard-off
SCRIPT = "examples/hf-finetune/train.py"
# The model and the run: big enough on a GPU for saves and uploads to take real time; tiny on a CPU.
SHAPES = {
    # ~26M parameters: a save (weights, AdamW's moments, RNG) of about 300 MB, a few seconds to upload here
    # Long enough to be training 120 s after the notice at step 300 (about 0.08 s a step on a GPU, a guess).
    "cuda": {"layers": 8, "width": 512, "block_size": 256, "batch_size": 16, "steps": 2400, "save_every": 200,
             "pause": 0.05, "notice_s": NOTICE_S},
    # The notice lasts 6 s here (Options.notice_scale): the same story, in a CPU's seconds.
    "cpu": {"layers": 2, "width": 64, "block_size": 64, "batch_size": 8, "steps": 150, "save_every": 10,
            "pause": 0.1, "notice_s": 6.0},
}
_SAVED = re.compile(r"step (\d+) saved as (\S+) \(write ([\d.]+) s, upload ([\d.]+) s\)")


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_e2e", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, help="training steps (default: the device's shape)")
    p.add_argument("--notice-s", type=float, help="how long Google's 120 s notice lasts here (default: the device's "
                   "shape: 120 on a GPU)")
    p.add_argument("--work", type=Path, help="the loss logs and outputs go here (default: a new temporary folder)")
    return p.parse_args(argv)


def train_args(device: str, shape: dict[str, Any], loss_log: Path, output: str) -> list[str]:
    return ["--device", device, "--deterministic", "--layers", str(shape["layers"]), "--width", str(shape["width"]),
            "--block-size", str(shape["block_size"]), "--batch-size", str(shape["batch_size"]),
            "--steps", str(shape["steps"]), "--save-every", str(shape["save_every"]), "--pause", str(shape["pause"]),
            "--output-dir", output, "--loss-log", str(loss_log)]


def records(loss_log: Path) -> list[dict[str, Any]]:
    if not loss_log.exists():
        return []
    lines = loss_log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a line being written is not one yet


def env_of(device: str) -> dict[str, str]:
    """What the trainer gets besides the agent's variables, in both runs: offline, and on a CPU one thread
    (the same kernels, the same sums, whatever the machine's load). The notice is the kit's default, Spot's
    30 s (RESPAWN_* names are the agent's: a spec may not set them)."""
    return {"PYTHONPATH": ".", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1" if device == "cpu" else "4",
            **({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} if device == "cuda" else {})}  # deterministic cuBLAS


def uninterrupted(device: str, shape: dict[str, Any], work: Path) -> tuple[dict[int, float], str, float, float]:
    folder = work / "uninterrupted"
    folder.mkdir(parents=True)
    log = folder / "losses.jsonl"
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(folder),
           **env_of(device), "PYTHONPATH": str(REPO_ROOT), "RESPAWN_CHECKPOINT_URI": str(folder / "bucket")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO_ROOT / SCRIPT), *train_args(device, shape, log, "output")],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed ({done.returncode}): {done.stderr[-3000:]}")
    rows = records(log)
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    final = next(r["final"] for r in rows if "final" in r)
    return losses, final, time.monotonic() - started, step_time(rows)


def step_time(rows: list[dict[str, Any]]) -> float:
    """Seconds per step once training runs, as the loss log times them (its later half: no start-up in it)."""
    timed = [r for r in rows if "loss" in r]
    half = timed[len(timed) // 2:]
    if len(half) < 2:
        return math.inf
    return (half[-1]["time"] - half[0]["time"]) / (half[-1]["step"] - half[0]["step"])


def long_enough(shape: dict[str, Any], at_step: int, step_s: float) -> int | None:
    """The --steps the notice needs (None: enough): training must go on past the soft-off, the notice after
    ``at_step``, with room to spare (the trainer is slower under the local cloud than alone)."""
    need = at_step + math.ceil((shape["notice_s"] * 1.5 + 5) / step_s)
    return None if shape["steps"] >= need else need


class Story:
    """The job under the local cloud, watched through its loss log and status."""

    def __init__(self, cloud: LocalCloud, loss_log: Path) -> None:
        self.cloud, self.loss_log = cloud, loss_log
        self.bucket = cloud.storage.bucket(cloud.options.bucket)

    def steps(self, attempt: int) -> list[dict[str, Any]]:
        return [r for r in records(self.loss_log) if r.get("attempt") == str(attempt) and "loss" in r]

    def status(self) -> JobStatus | None:
        blob = self.bucket.get_blob(names.status_key(JOB))
        return JobStatus.from_json(blob.download_as_bytes()) if blob else None

    def until(self, what: str, check: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := check():
                return found
            time.sleep(0.05)
        st = self.status()
        said = f" (the job: {st.phase}, attempt {st.attempt}: {st.message})" if st else " (no status yet)"
        raise SystemExit(f"gave up waiting for {what} after {timeout:.0f}s{said}")

    def submit(self, device: str, shape: dict[str, Any]) -> None:
        packed = pack.pack(REPO_ROOT)  # what `respawn submit --workdir .` uploads
        self.bucket.blob(packed.name).upload_from_string(packed.data)
        spec = yaml.safe_load((REPO_ROOT / "examples/hf-finetune/spec.yaml").read_text())
        command = " ".join(["python", SCRIPT, *train_args(device, shape, self.loss_log, "output")])
        spec.update(name=JOB, zones=["us-central1-a", "us-central1-b"], code=packed.uri(self.bucket.name),
                    preemption_notice="120s",
                    command=command, env={**spec.get("env", {}), **env_of(device)}, heartbeat_interval="2s",
                    checkpoint={**spec["checkpoint"], "uri": f"gs://{self.bucket.name}/checkpoints/{JOB}"},
                    policy={**spec.get("policy", {}), "startup_grace": "5m", "idle_timeout": "5m"})
        self.bucket.blob(names.spec_key(JOB)).upload_from_string(yaml.safe_dump(spec))

    def serial(self, attempt: int) -> str:
        assert self.cloud.compute is not None
        path = self.cloud.compute.workdir_of(f"{JOB}-{attempt}") / "serial-port-1.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def standby(self) -> Any:
        """The history event that booted attempt 2 beside attempt 1 (None if none did)."""
        st = self.status()
        return next((e for e in (st.history if st else ()) if e.event == "standby" and e.attempt == 1), None)

    def marker_time(self, step: int) -> float | None:
        """When the save of ``step`` was whole in the bucket: its trainer_state.json's creation."""
        blob = self.bucket.get_blob(f"checkpoints/{JOB}/checkpoint-{step}/trainer_state.json")
        return blob.time_created.timestamp() if blob is not None and blob.time_created else None


def preempt(story: Story, attempt: int, hard: bool, at_step: int, timeout: float,
            saved: int | None = None) -> dict[str, Any]:
    """Wait until ``attempt`` has trained ``at_step`` (and the save of step ``saved`` is whole in the bucket),
    preempt its VM (with the notice the spec asks for, or ``hard``: none, and no shutdown script), wait for
    the next attempt's first step."""
    compute = story.cloud.compute
    assert compute is not None
    if saved is not None:
        story.until(f"the save of step {saved} uploaded", lambda: story.marker_time(saved), timeout)
    story.until(f"attempt {attempt} to reach step {at_step}",
                lambda: (s := story.steps(attempt)) and s[-1]["step"] >= at_step, timeout)
    if hard:
        compute.scale_notice(0.0)  # Google's notice is best effort: this preemption comes with none
    at = time.time()
    compute.preempt(f"{JOB}-{attempt}", graceful=not hard)
    first = story.until(f"attempt {attempt + 1}'s first step", lambda: (s := story.steps(attempt + 1)) and s[0], timeout)
    trained = story.steps(attempt)
    reached, resumed = trained[-1]["step"], first["step"] - 1
    held = [r["time"] for r in trained if r["step"] == resumed]
    return {"attempt": attempt, "hard": hard, "at": at, "reached": reached, "resumed": resumed,
            "lost": reached - resumed, "recovery_s": first["time"] - at,
            "downtime_s": first["time"] - held[-1] if held else math.nan, "first": first["time"]}


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(f"  {'✓' if ok else '✗'} {what}")
    if not ok:
        failures.append(what)


def main(argv: list[str] | None = None) -> int:
    o = options(argv)
    shape = dict(SHAPES[o.device])
    if o.steps:
        shape["steps"] = o.steps
    if o.notice_s is not None:
        shape["notice_s"] = o.notice_s
    every = shape["save_every"]
    if shape["steps"] < 4 * every:
        raise SystemExit(f"--steps must be at least {4 * every}: three attempts, a save between each")
    work = o.work or Path(tempfile.mkdtemp(prefix="respawn-gpu-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"gpu_e2e on {o.device}: {shape}; work in {work}")
    reference, reference_weights, took, step_s = uninterrupted(o.device, shape, work)
    print(f"uninterrupted: {len(reference)} steps in {took:.1f} s ({step_s:.3f} s a step), final loss "
          f"{reference[shape['steps']]!r}, weights {reference_weights}")
    notice_at = every + every // 2
    if (need := long_enough(shape, notice_at, step_s)) is not None:
        raise SystemExit(f"--steps {shape['steps']} ends before the notice's soft-off ({shape['notice_s']:g} s after "
                         f"step {notice_at}, at {step_s:.3f} s a step): give --steps {need} at least")

    loss_log = work / "respawned" / "losses.jsonl"
    loss_log.parent.mkdir(parents=True)
    failures: list[str] = []
    with LocalCloud(Options(tick_interval=5.0, boot_delay=0.3, shutdown_budget=SHUTDOWN_S,
                            notice_scale=shape["notice_s"] / NOTICE_S)) as cloud:
        story = Story(cloud, loss_log)
        story.submit(o.device, shape)
        timeout = 600.0 + shape["notice_s"]
        notice = preempt(story, 1, hard=False, at_step=notice_at, timeout=timeout)
        standby = story.standby()
        resumed = notice["resumed"]
        # Half-way between two periodic saves, after at least one of this attempt's own was uploaded.
        periodic = (resumed // every + 1) * every
        hard = preempt(story, 2, hard=True, at_step=periodic + every // 2, timeout=timeout, saved=periodic)
        final = story.until("the job to finish", lambda: (s := story.status()) and s.phase.terminal and s, timeout)
        sigterm_saved = story.marker_time(notice["reached"])
        split = {int(m[0]): (float(m[2]), float(m[3])) for m in _SAVED.findall(story.serial(1))}

    rows = records(loss_log)
    trained: dict[int, list[float]] = {}
    for r in rows:
        if "loss" in r:
            trained.setdefault(r["step"], []).append(r["loss"])
    weights = next((r["final"] for r in rows if "final" in r), None)
    margin = min(SHUTDOWN_S / 4, 5.0)
    soft_off = notice["at"] + shape["notice_s"]
    save_s = None if sigterm_saved is None else sigterm_saved - soft_off
    # The kit's save at the notice: a step saved after the notice, before the SIGTERM's, off the periodic beat.
    at_notice = sorted(s for s in split if s % every and s < notice["reached"])

    print(f"\nrespawned run: {final.phase}, {final.attempt} attempts, {final.preemptions} preemptions")
    for p in (notice, hard):
        kind = "hard (no notice)" if p["hard"] else f"with the {NOTICE_S:g} s notice ({shape['notice_s']:g} s here)"
        print(f"  preemption of attempt {p['attempt']} {kind}: reached step {p['reached']}, attempt "
              f"{p['attempt'] + 1} resumed at step {p['resumed']}: {p['lost']} steps lost; downtime "
              f"{p['downtime_s']:.1f} s (step {p['resumed']} -> attempt {p['attempt'] + 1}'s first step), its first "
              f"step {p['recovery_s']:.1f} s after the {'preemption' if p['hard'] else 'notice'}")
    if standby is not None:
        print(f"  attempt 2 booted beside attempt 1 {standby.at.timestamp() - notice['at']:.1f} s after the notice: "
              f"{standby.detail}")
    go = next((e.at.timestamp() for e in final.history if e.attempt == 2 and "giving the go" in e.detail), None)
    if go is not None and sigterm_saved is not None:
        # The downtime's parts: the save, its marker's way to the go, the trainer's start to its first step.
        print(f"  after the SIGTERM: the save {sigterm_saved - soft_off:.2f} s, then the go {go - sigterm_saved:.2f} s "
              f"later, attempt 2's first step {notice['first'] - go:.2f} s after the go")
    print(f"  the kit's save at the notice: step(s) {at_notice or 'none'}")
    if save_s is not None:
        write, upload = split.get(notice["reached"], (None, None))
        kit = f" (the kit: write {write:.2f} s, upload {upload:.2f} s)" if write is not None else ""
        print(f"  SIGTERM save of step {notice['reached']}: {save_s:.2f} s from SIGTERM to trainer_state.json "
              f"uploaded{kit}, against Spot's {SHUTDOWN_S:g} s ({SHUTDOWN_S - margin:g} s before the marker)")
    print(f"  wall time {time.monotonic() - started:.0f} s\n")

    check(final.phase == Phase.SUCCEEDED and final.preemptions == 2, "the job succeeded after 2 preemptions", failures)
    check(sorted(trained) == list(range(1, shape["steps"] + 1)), "every step was trained", failures)
    differ = sorted(s for s, losses in trained.items() if any(loss != reference.get(s) for loss in losses))
    check(not differ, f"every step's loss equals the uninterrupted run's{f' (not: {differ[:10]})' if differ else ''}",
          failures)
    check(weights == reference_weights, f"final weights {weights} == the uninterrupted run's {reference_weights}",
          failures)
    check(standby is not None and standby.detail.startswith("preemption notice")
          and standby.at.timestamp() < soft_off, "attempt 2 booted at the notice (its record), before the soft-off",
          failures)
    check(bool(at_notice), "the kit saved at the notice and trained on", failures)
    check(notice["lost"] == 0, "0 steps lost to the preemption with notice", failures)
    check(save_s is not None and save_s <= SHUTDOWN_S - margin,
          "the SIGTERM save landed before the shutdown script's marker deadline", failures)
    check(hard["resumed"] > notice["resumed"], "the hard preemption resumed from a periodic save of attempt 2",
          failures)
    print("✓ gpu_e2e passed" if not failures else f"✗ gpu_e2e: {len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
