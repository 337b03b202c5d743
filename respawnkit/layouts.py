"""How a save is named under the checkpoint prefix, and which object proves it complete.

Each layout is one that respawn's finder (``controller/core/checkpoints.py``) already
recognises; the saver uploads every other file of a save first and the marker last, with
``<save>-unfinished`` beside the save from before its first file to after its last, so a
save the finder takes as complete is whole.
"""

from __future__ import annotations

from dataclasses import dataclass


# The top-level file names respawn's finder takes as proof of a whole save in any format (``_DIR_MARKERS``;
# ``commit_success`` as a prefix): a save holding one (a DCP ``.metadata`` in a STEP_DIR save) uploads it after
# every other file and just before its layout's own marker, or the finder could pick the save half uploaded.
FINDER_MARKERS = (".metadata", "trainer_state.json", "_SUCCESS", "COMPLETE", "DONE")


def finder_marker(name: str) -> bool:
    """Whether respawn's finder would take ``name`` (relative to the save's folder) as a completion marker."""
    return "/" not in name and (name in FINDER_MARKERS or name.startswith("commit_success"))


# No order of a save's files alone can keep every prefix of its upload from looking complete: a save may hold
# two files the finder takes as proofs (a DCP ``.metadata`` and the layout's ``_SUCCESS``), or a shape that is one
# (Accelerate's model and ``random_states_0.pkl``, with no marker at all). So an object named
# ``<save>-unfinished`` goes up before the save's first file and is removed after its last: respawn's finder takes
# no save with one beside it as complete, in any format (NeMo's convention). A save cut off leaves it there.
UNFINISHED = "-unfinished"


def unfinished(name: str) -> str:
    """The object beside save ``name`` while it uploads."""
    return name + UNFINISHED


@dataclass(frozen=True)
class Layout:
    """``pattern`` formats a step (``{step}``) into the save's name under the prefix; ``marker`` names the
    object inside that directory written last, or is None for a save that is one object (a GCS object
    appears whole or not at all, so it needs no marker)."""

    pattern: str
    marker: str | None = None
    marker_from_writer: bool = False  # the framework writes the marker itself (and it must be there)

    def name(self, step: int) -> str:
        return self.pattern.format(step=step)

    @property
    def single(self) -> bool:
        return self.marker is None


STEP_DIR = Layout("step-{step:09d}", "_SUCCESS")  # the kit's default: the finder's "files" format
HUGGINGFACE = Layout("checkpoint-{step}", "trainer_state.json", marker_from_writer=True)
DCP = Layout("step-{step:09d}", ".metadata", marker_from_writer=True)  # torch.distributed.checkpoint
ORBAX = Layout("{step}", "commit_success.txt")  # what Orbax writes last on GCS
LIGHTNING_STEPS = Layout("step-{step:09d}.ckpt")  # numbered single files: the finder's "files"
LIGHTNING_LAST = Layout("last.ckpt")  # Lightning's own tracker: always the newest
