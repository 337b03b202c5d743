"""Where respawn has ever created a TPU node: a record in the control bucket that outlives jobs.

Cloud TPU has no aggregated list (each zone is listed on its own, and Google documents no
``locations/-`` wildcard for nodes), so a node is found only in a zone that is looked in.
A job's status names the zones its nodes were created in, but a job folder deleted whole
(spec and status) takes that with it, and its node would bill forever unseen. So before
any TPU create, the executor adds the (project, zone) to ``respawn/tpu-zones.json``, and
every full pass lists those zones too: a node whose job has neither spec nor status is an
orphan there, deleted like a VM's.

The object is the controller's: trainer VMs cannot write it (their IAM condition names
their own records only). Someone with write access to the bucket could add pairs; a pair
is read only if it is well formed and its project is one the controller watches, and at
most ``MAX_PAIRS`` are read: a forged list costs more listings, on a listing of their own
that never blinds a job (``Observer._recorded_tpu_nodes``), never a delete outside the
policy (the planner deletes only labelled nodes of spec-less jobs); a full one stops TPU
creates with a ConfigError naming it (never a refusal by Google, which would fail the job).
"""

from __future__ import annotations

import json
import re
import threading

from controller.core import errors
from controller.core.ports import BlobStore

KEY = "respawn/tpu-zones.json"
# The same record for TPU slices in Compute Engine (instances and MIGs): their projects are listed
# (aggregated, every zone) for orphans; the Cloud TPU API is never asked about them.
SLICES_KEY = "respawn/tpu-slice-zones.json"
MAX_PAIRS = 500  # TPU zones number a few dozen; watched projects a handful
_PROJECT = re.compile(r"[a-z][-a-z0-9]{4,28}[a-z0-9]")
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_TRIES = 5  # compare-and-swap rounds against other passes adding their own zone

Pair = tuple[str, str]


def parse(data: bytes) -> set[Pair]:
    """The well-formed pairs of the record; anything else in it is ignored."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return set()
    pairs = raw.get("zones") if isinstance(raw, dict) else None
    if not isinstance(pairs, list):
        return set()
    found: set[Pair] = set()
    for pair in pairs[:MAX_PAIRS]:
        if (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
                and _PROJECT.fullmatch(pair[0]) and _ZONE.fullmatch(pair[1])):
            found.add((pair[0], pair[1]))
    return found


class TpuZones:
    """The record, read and added to by compare-and-swap; pairs known to be in it are kept in memory."""

    def __init__(self, store: BlobStore, bucket: str, key: str = KEY) -> None:
        self.store = store
        self.bucket = bucket
        self.key = key
        self._known: set[Pair] = set()
        self._lock = threading.Lock()

    def read(self) -> set[Pair]:
        """The pairs recorded; a record that cannot be read raises (the caller decides what blinds)."""
        try:
            blob = self.store.read(self.bucket, self.key, limit=256 * 1024)
        except errors.NotFound:
            return set()
        except errors.TooLarge:
            return set()
        found = parse(blob.data)
        with self._lock:
            self._known |= found
        return found

    def remember(self, project: str, zone: str) -> None:
        """Make sure (project, zone) is recorded before a node is created there; raises a
        RespawnError when it cannot be (the create then waits for the next pass), never one that
        reads as Google refusing the zone (a RequestError or NotFound would fail the job)."""
        pair = (project, zone)
        with self._lock:
            if pair in self._known:
                return
        for _ in range(_TRIES):
            try:
                blob = self.store.read(self.bucket, self.key, limit=256 * 1024)
                current, generation = parse(blob.data), blob.info.generation
            except errors.NotFound:
                current, generation = set(), 0
            except errors.TooLarge:
                # Not the controller's (it writes a few KiB at most), and read by no pass
                # (``read``): written over, by generation, with the pair.
                try:
                    current, generation = set(), self.store.stat(self.bucket, self.key).generation
                except errors.NotFound:
                    current, generation = set(), 0
            if pair not in current:
                if len(current) >= MAX_PAIRS:
                    raise errors.ConfigError(f"gs://{self.bucket}/{self.key} already records {MAX_PAIRS} TPU zones; "
                                              "remove the zones of projects no longer used")
                body = json.dumps({"zones": sorted(map(list, current | {pair}))}, indent=1)
                try:
                    self.store.write(self.bucket, self.key, body.encode(), if_generation_match=generation)
                except errors.PreconditionFailed:
                    continue  # another pass added its own: read again
                current = current | {pair}
            with self._lock:
                self._known |= current
            return
        raise errors.TransientError(f"could not record TPU zone {zone} of {project} in gs://{self.bucket}/{self.key}")
