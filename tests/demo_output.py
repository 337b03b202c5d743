"""What ``respawn demo`` prints, line by line, as templates: the README's sample output
(tests/unit/test_readme_demo.py) and a real run's output (tests/e2e/test_demo.py) are both held
to them, so the sample cannot drift from the demo. Times, ports, steps, weights and the
report's folder vary from run to run; the templates say where."""

from __future__ import annotations

import re

T = r"\d+\.\ds"  # the seconds since the start that begin a story line
STATUS = r"(PENDING|PROVISIONING|RUNNING|RECOVERING|SUCCEEDED|FAILED|CANCELLED)"

STORY = [  # one story line each, whitespace collapsed (a wrapped line is joined again)
    rf"{T} local cloud up: GCS http://127\.0\.0\.1:\d+, Compute http://127\.0\.0\.1:\d+",
    rf"{T} uninterrupted reference \(400 steps, the VMs' python\): weights [0-9a-f]{{16}}",
    rf"{T} submitted demo: Spot g2-standard-8 \+ L4 over us-central1-a, us-central1-b; 400 steps, checkpoint every 40",
    rf"{T} {STATUS} attempt \d+( in us-central1-[ab])?(, resuming from step \d+)? — .+",
    rf"{T} preempting demo-1 hard at step \d+, with no notice: no checkpoint yet, and the guest never runs its "
    r"shutdown script \(no marker\)",
    rf"{T} demo-2 inserted \d+\.\ds after the loss, by (on_audit: Compute's System Event entry "
    r"\(compute\.instances\.preempted\) reached it through the Logging sink and a Pub/Sub push \d+\.\ds after the loss"
    r"|another pass \(.+\))",
    rf"{T} stockout in us-central1-[ab] \(capacity advice does not foresee it\); preempting demo-2 at step \d+ "
    r"with its notice \(Spot's 120 s, \d+(\.\d+)? s here\): demo-3 boots beside it while it saves",
    # Zero-gap recovery (controller.render.handover_view): a standby's stages, each said once if seen.
    rf"{T} demo-[34] booting in us-central1-[ab] while demo-[23] saves( \(its trainer at step \d+\))?",
    rf"{T} demo-[34] at the starting line (since|by) \d\d:\d\d:\d\d UTC, waiting for demo-[23]'s save",
    rf"{T} demo-[34] started from step \d+(, \d+\.\ds after (demo-[23]'s|that) save| \((demo-[23]'s|that) save\))",
    rf"{T} stockout over; preempting demo-3 at step \d+ with its notice",
]
# The summary table's rows, in order: (name, its value).
ROWS = [("outcome", r"SUCCEEDED"), ("attempts", r"\d+"), ("preemptions", r"\d+"), ("stockouts met", r"\d+"),
        ("zero-gap recoveries", r"\d+(: trainer started (\d+\.\ds|\S+|—)(, (\d+\.\ds|\S+|—))* after the save)?"),
        ("failures", r"\d+"), ("steps lost to preemption", r"\d+"), ("final loss", r"\d+\.\d+"),
        ("final weights", r"[0-9a-f]{16}"), ("uninterrupted run", r"[0-9a-f]{16}"), ("wall time", r"\d+ s")]
OTHER = [  # the table's title and borders, and what follows it
    r"respawn demo", r"[┌├└][─┬┼┴]+[┐┤┘]",
    r"attempt \d+: reached step \d+; attempt \d+ resumed at \d+",
    r"report: \S+/demo-report\.(html|png)",
    r"✓ same weights as an uninterrupted run",
]
_ROW = re.compile(r"│ (?P<name>[a-z -]+?) +│ (?P<value>.+?) +│")
_STORY_LINE = re.compile(rf"^ *{T} ")
_CONTINUED = re.compile(r"^ {8}\S")  # a story line's text goes on under itself (the title is centred further in)


def logical_lines(text: str) -> list[str]:
    """``text``'s lines with a wrapped story line joined again (its continuation lines hang
    under its text), whitespace collapsed; blank lines dropped."""
    lines: list[str] = []
    story = False
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if story and _CONTINUED.match(raw):
            lines[-1] += " " + " ".join(raw.split())
            continue
        story = bool(_STORY_LINE.match(raw))
        lines.append(" ".join(raw.split()) if story or not raw.lstrip().startswith("│") else raw.strip())
    return lines


def rows(lines: list[str]) -> list[tuple[str, str]]:
    """The summary table's rows (name, value) among ``lines``."""
    return [(m["name"], m["value"]) for line in lines if (m := _ROW.fullmatch(line))]


def unmatched(lines: list[str]) -> list[str]:
    """The lines no template describes."""
    every = [re.compile(p) for p in STORY + OTHER]
    named = {name: re.compile(value) for name, value in ROWS}
    out = []
    for line in lines:
        if (m := _ROW.fullmatch(line)) and m["name"] in named and named[m["name"]].fullmatch(m["value"]):
            continue
        if not any(p.fullmatch(line) for p in every):
            out.append(line)
    return out
