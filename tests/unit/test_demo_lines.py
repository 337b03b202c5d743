"""`respawn demo`'s story lines, as the console prints them at 80 columns: wrapped or
shortened on word boundaries, never cut inside a word ("resuming from g")."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from controller.core.state import CheckpointRef, JobStatus, Phase
from localcloud.demo import MESSAGE_LIMIT, event_line, shorten, status_line

URI = "gs://respawn-local/checkpoints/demo/step-000080"
LAUNCH = ("attempt 1 preempted in us-central1-a (graceful; marker saved); creating demo-2 in us-central1-b "
          f"(spot; obtainability 0.90, Spot uptime 3.2 d, 4.0% preempted a day), resuming from {URI}")


def printed(renderable: object, width: int = 80) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    console.print(renderable)
    return [line.rstrip() for line in console.file.getvalue().splitlines()]  # type: ignore[attr-defined]


def status(message: str, phase: Phase = Phase.PROVISIONING) -> JobStatus:
    return JobStatus(phase=phase, attempt=2, zone="us-central1-b", message=message,
                     resume_from=CheckpointRef(uri=URI, step=80))


MESSAGES = [
    LAUNCH,  # the old [:90] cut it at "resuming from g"
    "spec accepted",
    "attempt 2 running on demo-2 since 12:00:03 (every node RUNNING and heartbeating)",
    "Compute refused the insert: " + "QUOTA_EXCEEDED in region us-central1 for NVIDIA_L4_GPUS " * 8,  # past the limit
]


@pytest.mark.parametrize("message", MESSAGES)
def test_a_status_line_at_80_columns_breaks_only_between_words(message):
    line = status_line(status(message))
    lines = printed(event_line(12.3, line))
    assert len(lines) > 1 or len(line.plain) < 70  # the long ones did wrap
    assert all(len(x) <= 80 for x in lines), lines
    # Every word of the line is on the screen whole: had one been cut across two lines, the
    # words read back would differ from the words written.
    assert " ".join(" ".join(lines).split()) == "12.3s " + " ".join(line.plain.split())
    # The continuation lines hang under the text, not under the time.
    assert all(x.startswith(" " * 7) for x in lines[1:]), lines


def test_the_checkpoint_uri_the_old_cut_broke_is_shown_whole():
    lines = printed(event_line(12.3, status_line(status(LAUNCH))))
    words = " ".join(lines).split()
    assert URI in words, lines
    assert not any(w.endswith("g") and URI.startswith(w) for w in words if w != URI)


def test_a_message_past_the_limit_is_shortened_after_a_whole_word():
    message = MESSAGES[-1]
    shown = status_line(status(message)).plain.split(" — ", 1)[1]
    assert len(shown) <= MESSAGE_LIMIT and shown.endswith(" …")
    head = shown.removesuffix(" …")
    assert message.startswith(head) and message[len(head)] == " ", head[-30:]


@pytest.mark.parametrize("text, limit, expected", [
    ("short enough", 40, "short enough"),
    ("resuming from gs://bucket/checkpoints/demo/step-000080", 20, "resuming from …"),
    ("one two three", 9, "one two …"),  # "one two" ends right where the limit leaves room for " …"
    ("one two three", 8, "one …"),  # "two" would not fit whole
    ("a" * 50, 10, "a" * 8 + " …"),  # one word longer than the limit: nothing else to cut at
    ("spaced\n  out\ttext", 40, "spaced out text"),
])
def test_shorten_cuts_between_words(text, limit, expected):
    assert shorten(text, limit) == expected
    assert len(shorten(text, limit)) <= limit


def test_the_controllers_message_is_never_read_as_markup():
    lines = printed(event_line(1.0, status_line(status("bad [/bold] and [red]text"))))
    assert "bad [/bold] and [red]text" in " ".join(" ".join(lines).split())


def test_the_storys_own_markup_still_styles_and_wraps_between_words():
    text = ("[red]preempting demo-1 hard[/red] at step 12, with no notice: no checkpoint yet, and the guest never "
            "runs its shutdown script (no marker)")
    lines = printed(event_line(3.2, text))
    assert lines[0].startswith("   3.2s preempting demo-1 hard at step 12")
    assert " ".join(" ".join(lines).split()) == ("3.2s preempting demo-1 hard at step 12, with no notice: no checkpoint "
                                                "yet, and the guest never runs its shutdown script (no marker)")


def test_the_demos_line_for_a_launch_in_a_zone_just_stocked_out_does_not_claim_its_advice():
    """Issue 26: the demo said "creating ... in us-central1-a (spot; obtainability 0.90 ...)" of a
    zone the controller had just seen stock out, on the strength of advice kept for 5 minutes."""
    from datetime import datetime, timedelta, timezone

    from controller.core import errors, transitions
    from controller.core.ports import ZoneAdvice
    from controller.core.spec import parse_spec

    now = datetime(2026, 11, 27, 12, tzinfo=timezone.utc)
    spec = parse_spec("zones: [us-central1-a, us-central1-b]\nmachine_type: g2-standard-8\ncommand: x\n", "demo")
    st = JobStatus(attempt=2, zone="us-central1-a", provisioning="spot")
    st = transitions.after_create_error(st, spec, errors.CapacityError("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED"),
                                        now - timedelta(seconds=20))
    advice = {"us-central1-a": ZoneAdvice(0.9, 30 * 86400.0, 0.0), "us-central1-b": ZoneAdvice(0.9, 30 * 86400.0, 0.0)}
    launched = transitions.begin_attempt(st, spec, "p", "us-central1-a", ["demo-3"], None, now, "preempted", 1,
                                         "tok", "spot", advice)
    words = " ".join(" ".join(printed(event_line(9.9, status_line(launched)))).split())
    assert "creating demo-3 in us-central1-a" in words and "obtainability 0.90" not in words, words
    assert "stocked out 20s ago: capacity advice set aside" in words, words


# -- zero-gap recovery: the story says each standby's stages, once each (issue 34) ------------------

def test_the_story_says_each_stage_of_a_standby_once_and_never_one_it_has_passed():
    from controller.core import names
    from controller.core.ports import InstanceStatus
    from controller.render import handover_view
    from localcloud.demo import Overlaps
    from tests.harness import BUCKET, Harness, spec_doc

    h = Harness()
    h.submit("demo", spec_doc(zones=["us-central1-a", "us-central1-b"]))
    h.tick()
    h.tick()
    story = Overlaps("demo")
    assert story.said(h.status("demo"), None, 40) is None  # no standby: nothing to say
    h.notice("demo")
    h.tick("demo")
    st = h.status("demo")
    assert story.said(st, None, 96) == "demo-2 booting in us-central1-b while demo-1 saves (its trainer at step 96)"
    assert story.said(st, None, 99) is None  # said once
    h.ready("demo", waiting_since=h.clock.now())
    blob = h.store.read(BUCKET, names.ready_key("demo"))
    ready = handover_view.at_line(blob.info, blob.data, st)
    assert story.said(st, ready, 99) == f"demo-2 at the starting line since {h.clock.now():%H:%M:%S} UTC, waiting for demo-1's save"
    assert story.said(st, None, 99) is None  # booting again? never: it was at its line
    h.checkpoint(159)
    h.compute.set_status("demo-1", InstanceStatus.STOPPING)
    h.marker("demo")
    h.tick("demo")
    assert story.said(h.status("demo"), None, None) is None  # given the go: the status line says it
    h.advance(seconds=1)
    h.heartbeat("demo", trainer_started=h.clock.now())
    h.tick("demo")
    said = story.said(h.status("demo"), None, None)
    assert said == "demo-2 started from step 159, 1.0s after demo-1's save"
    lines = printed(event_line(21.7, said))
    assert len(lines) == 1 and len(lines[0]) <= 80  # each stage's line fits 80 columns in the demo
    assert story.said(h.status("demo"), None, None) is None
