"""Issue 26's proof: the README's walkthrough ("See respawn heal your own job") run end to end as
it is written. Its commands are read from docs/local-cloud.md's fenced blocks (the README links to it), not copied here, so that
the test follows the README: `respawn local up --tick 5` in one terminal (a background process,
stopped at the end), then, in another, each `$` line in order, in bash, with the `source` line
it printed, from a folder that holds `examples/` (the README's "from the repository's folder";
`$PWD` in the spec is that folder). A command this test does not know fails it, and so does one
that exits non-zero, or whose README output lines it does not print.

The README's comments say what a user waits for before the next line ("RUNNING, mine-1 in
us-central1-a, checkpoints as it trains", "attempt 2: mine-2 in us-central1-b", "SUCCEEDED
once ..."): the test waits for the same, and before a fault on `mine-N`, for attempt N to
run. Two things are changed, and said: the trainer's pace (STEP_SECONDS "0.1", ten minutes of
training in all) runs 20 times faster, and the local cloud's Spot times ten times shorter
(RESPAWN_LOCAL_NOTICE=3: the 30 s shutdown in 3 s, the 120 s preemption notice in 12 s, during
which the old VM trains on: at the README's 120 s, the faster trainer would finish the job within
it), so that the whole walkthrough takes about a minute and a half; the failure's 30 s backoff is
the README's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.cli import buckets
from controller.core import names
from controller.core.state import JobStatus, Phase
from controller.service.config import REPO_ROOT
from localcloud.gcs import client
from tests.wait import Terminal, until

SECTION = "## See respawn heal your own job"
PACE = ('STEP_SECONDS: "0.1"', 'STEP_SECONDS: "0.005"')  # the first change: training 20 times faster
NOTICE = "3"  # the second: `respawn local up`'s Spot shutdown in 3 s, its preemption notice in 12 s
KNOWN = {"respawn", "source", "gcloud", "cat"}  # the programs the walkthrough may run


@dataclass
class Step:
    command: str  # as written (a heredoc's lines included)
    comment: str = ""  # what the README says of it, continuation lines joined
    output: tuple[str, ...] = ()  # the lines the README shows it printing


def walkthrough() -> tuple[str, list[Step]]:
    """The README's walkthrough: the first terminal's command, and the second terminal's steps."""
    readme = (REPO_ROOT / "docs" / "local-cloud.md").read_text()  # the README's route 1 links to it
    assert SECTION in readme, f"docs/local-cloud.md has no section {SECTION!r}"
    section = re.split(r"\n##+ ", readme.split(SECTION, 1)[1], maxsplit=1)[0]
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", section, re.S | re.M)
    assert len(blocks) >= 2, "the walkthrough shows a command for each terminal"
    first = blocks[0].strip()
    steps: list[Step] = []
    lines = iter(blocks[1].splitlines())
    for line in lines:
        if line.startswith("$ "):
            command, _, comment = line[2:].partition("  #")
            command = command.strip()
            if marker := re.search(r"<<'?(\w+)'?$", command):  # a heredoc: its lines, to its end marker
                for body in lines:
                    command += "\n" + body
                    if body.strip() == marker.group(1):
                        break
            steps.append(Step(command, comment.strip().lstrip("# ")))
        elif line.strip().startswith("#") and steps:
            steps[-1].comment += " " + line.strip().lstrip("# ")
        elif line.strip() and steps:
            steps[-1].output += (line.strip(),)
    return first, steps


@pytest.fixture
def terminals(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The first terminal running the README's `respawn local up` (the virtualenv active, a home of
    its own so that ~/.respawn is the test's), and the second terminal's environment and folder."""
    first, _ = walkthrough()
    assert first.split()[:3] == ["respawn", "local", "up"], first
    home, folder = tmp_path / "home", tmp_path / "repo"
    home.mkdir()
    folder.mkdir()
    (folder / "examples").symlink_to(REPO_ROOT / "examples")
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("RESPAWN_", "CLOUDSDK_", "STORAGE_EMULATOR"))}
    shell.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{shell.get('PATH', '')}",
                 CLOUDSDK_CORE_DISABLE_PROMPTS="1", COLUMNS="200", RESPAWN_LOCAL_NOTICE=NOTICE)
    with Terminal(["bash", "-c", first], shell, folder) as up:
        yield {"shell": shell, "folder": folder, "home": home, "printed": up.lines}
        assert up.stop() == 0, "".join(up.lines)[-3000:]
        assert "local cloud stopped" in "".join(up.lines)


def test_the_readmes_walkthrough_heals_the_job_as_it_is_written(terminals):
    _, steps = walkthrough()
    shell, folder, home = terminals["shell"], terminals["folder"], terminals["home"]
    unknown = [s.command for s in steps if s.command.split()[0] not in KNOWN]
    assert unknown == [], f"the walkthrough runs commands this test does not know: {unknown}"
    sources = [s.command for s in steps if s.command.startswith("source ")]
    assert len(sources) == 1, sources
    # `respawn local up` printed exactly the line the README has the user run.
    printed = [line.strip() for line in terminals["printed"] if line.startswith("source ")]
    assert printed == [sources[0].replace("~", str(home), 1)], terminals["printed"][:5]
    exports = dict(re.findall(r"^export (\w+)=(\S+)$", Path(printed[0].split()[1]).read_text(), re.M))
    storage = client(exports["STORAGE_EMULATOR_HOST"], exports["RESPAWN_PROJECT"]).bucket(exports["RESPAWN_BUCKET"])
    job = next(re.search(r"respawn submit (\S+)\.yaml", s.command).group(1) for s in steps
               if s.command.startswith("respawn submit"))

    def status() -> JobStatus | None:
        blob = storage.get_blob(names.status_key(job))
        return JobStatus.from_json(blob.download_as_bytes()) if blob else None

    def running(attempt: int, zone: str | None = None) -> bool:
        st = status()
        return bool(st and st.attempt == attempt and st.phase == Phase.RUNNING and (zone is None or st.zone == zone))

    # The walkthrough's spec keeps its checkpoints where deploy (and local up) would have them.
    kept = client(exports["STORAGE_EMULATOR_HOST"], exports["RESPAWN_PROJECT"]).bucket(
        buckets.checkpoints_bucket(exports["RESPAWN_BUCKET"]))

    def checkpointed() -> bool:
        return any(b.name.endswith("/_SUCCESS") for b in kept.list_blobs(prefix=f"{job}/"))

    ran: list[str] = []
    for step in steps:
        command = step.command
        if command.startswith("cat >"):
            assert PACE[0] in command, f"the spec's pace changed in the README: {command}"
            command = command.replace(*PACE)
        if command.startswith("gcloud") and not any(Path(p, "gcloud").exists() for p in shell["PATH"].split(":")):
            ran.append(f"(not run: gcloud is not installed) {command}")
            continue
        # Before a fault on one of the job's machines, that attempt runs (as a user sees it do).
        if target := re.fullmatch(rf"respawn local (?:preempt|crash|maintenance) {job}-(\d+)", command):
            until(f"attempt {target.group(1)} running", lambda: running(int(target.group(1))), 90)
        done = subprocess.run(["bash", "-c", "\n".join([*sources, command])], env=shell, cwd=folder,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        shown = " ".join(done.stdout.split())
        for line in step.output:
            assert " ".join(line.split()) in shown, f"{command} did not print {line!r}: {done.stdout}"
        ran.append(command)
        # What the README says the user sees next, waited for as a user waits for it.
        said = step.comment
        if command == f"respawn status {job}":
            if "SUCCEEDED" in said:
                final = until(f"{job} to finish", lambda: (s := status()) and s.phase.terminal and s, 120)
                assert final.phase == Phase.SUCCEEDED, final.message
            elif where := re.search(rf"attempt (\d+): {job}-\d+ in ([\w-]+)", said):
                until(said, lambda: running(int(where.group(1)), where.group(2)), 90)
            elif where := re.search(rf"RUNNING, {job}-(\d+) in ([\w-]+)", said):
                until(said, lambda: running(int(where.group(1)), where.group(2)) and checkpointed(), 90)
            else:
                pytest.fail(f"the README's comment on {command!r} says nothing this test can wait for: {said!r}")
    final = status()
    assert final is not None and final.phase == Phase.SUCCEEDED
    # Every loss of the walkthrough is in its history: a preemption, a failure, host maintenance.
    events = {e.event for e in final.history}
    assert {"preempted", "failed", "maintenance"} <= events, sorted(events)
    shown = subprocess.run(["bash", "-c", "\n".join([*sources, f"respawn status {job}"])], env=shell, cwd=folder,
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL).stdout
    assert "SUCCEEDED" in shown, shown
    assert len(ran) == len(steps), ran
