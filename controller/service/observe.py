"""Observe: one listing of the bucket, one label-filtered instance list, then reads.

Order matters. The bucket is listed *before* the instances, and each status is read at the
generation that listing named, so an instance seen is never older than the status it is
judged against: "status says inserted, instance missing" really means missing. (A pass over
every job reads its statuses after asking for the instance list, a chunk at a time: a status
replaced since the listing is not read as it is now, its job is observed again alone.) The
price is that a job created in between looks spec-less; orphan deletes therefore re-check the
spec just before acting (executor).
For a VM seen stopped or gone, its job's marker and exit record are re-read *after*
the instance list, because a VM writes them before it powers off: a fresh read cannot
miss them, where the earlier listing could.

A heartbeat is judged from the listing alone where its VM agent wrote its record in the
object's custom metadata (``Record.listed``): a trainer beats every minute, and reading each
beat was most of a steady tick's requests.
"""

from __future__ import annotations

import enum
import heapq
import logging
import re
import sys
import threading
import time
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from controller.core import checkpoints, errors, names, placement
from controller.service import fanout, snapshot
from controller.service.advice import AdviceCache
from controller.service.snapshot import Snapshot
from controller.service.tpuzones import SLICES_KEY, TpuZones
from controller.core.policy import ControllerPolicy
from controller.core.shards import Shard
from controller.core.ports import (Blob, BlobInfo, BlobStore, CapacityAdvisor, ComputeGateway, Instance, InstanceList,
                              StopReason, Stopped, TpuGateway, TpuList, TpuNode)
from controller.core.spec import MAX_SPEC_BYTES, Checkpoint, JobSpec, SpecError, parse_spec
from controller.core.state import CheckpointRef, JobStatus, Phase
from controller.core.sweep import MAX_PARALLEL, SWEEP_LIMIT_KEY, SweepRecord
from controller.core.world import MAX_RECORD_BYTES, SLOT_HOLDER, JobView, Record, Slots, World

log = logging.getLogger(__name__)
UNEXPECTED = "unexpected"  # prefix of a failure no retry is known to fix
# Seconds the TPU listing of a pass may take (its zones side by side, each retried) before the
# TPU jobs are left blind for that pass; the VM jobs never wait on it past this.
TPU_LIST_TIMEOUT = 20.0
# status.json is the controller's own, bounded by its history limit: a few hundred KiB.
MAX_STATUS_BYTES = 4 * 1024 * 1024
SWEEP_RECORD_LIMIT = 4 * 1024 * 1024  # sweeps/<sweep>/sweep.json: 1,000 trials and their parameters
_SLOT_NUMBER = re.compile(r"0|[1-9][0-9]{0,2}")  # as the controller writes them: "00" is no slot 0
PARSED_CACHE_BYTES = 128 * 1024 * 1024  # by what the entries hold in memory (``footprint``)
_ONE_JOB = 8  # a single job's reads sent side by side (its few objects; a gang's nodes)
# VM records of names with neither spec nor status handed to the planner per pass, oldest
# first (it deletes those past planner.STRAY_GRACE): a million strays cost a million lines
# in the listing, never a million deletes in one pass.
MAX_STRAYS = 500
# Worker exit records of a job that no rank of its current attempt can have written, handed
# over per pass (to be cleaned up, never read).
MAX_UNREAD_NODE_EXITS = 100
# Jobs read, planned and acted on together in a pass over every job: its memory holds one chunk's
# statuses (a parsed status at its history limit is about 160 KiB), not the fleet's.
CHUNK = 256
# A shard's jobs in a chunk whose running VMs its list does not show, each looked for in its own
# zones; more than this, and one list of every managed VM serves the pass (``_unlabelled``).
ALONE_MAX = 16
_RECORD_KINDS = ("marker", "exit", "heartbeat", "notice", "ready")
T = TypeVar("T")


class Parsed:
    """What was made of an object, by (bucket, name, generation), kept between passes.

    A generation names one content forever, so a job whose objects did not change since
    the last pass costs no read and no parse: a finished job costs nothing but its lines
    in the listing. Kept per observer, which a function instance keeps between passes, and
    bounded by what its entries really hold in memory (``footprint``), not by the objects'
    sizes in the bucket: a parsed spec is about 20 times its YAML.

    A pass over every job reads the fleet's objects in the same order each time, so a least
    recently used cache a little smaller than the fleet evicts each entry just before the next
    pass needs it, and every read misses (10,000 steady-size jobs in 128 MiB: 21,000 object
    reads a tick). Here room is made only from entries no pass has used since the one before
    began (``begin``): a replaced generation, a deleted job. With none such, a new entry is not
    kept (it is read again next pass): a fleet larger than the cache keeps a fixed part of it
    cached, never none of it.
    """

    def __init__(self, max_bytes: int = PARSED_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0  # bytes counted by the entries held
        self._entries: OrderedDict[tuple[str, str, int], tuple[int, Any, int]] = OrderedDict()  # (size, value, pass)
        self._pass = 0
        self._lock = threading.Lock()

    def begin(self) -> None:
        """A pass over every job begins: what the one before did not use may make room from now on.
        (A pass for one job, an event's or a replan's inside a pass, is no such pass: counted, two
        replans in a pass made the entries it had not reached yet evictable, and it thrashed again.
        A process that never makes a pass over every job, an event function's, evicts the least
        recently used entry.)"""
        with self._lock:
            self._pass += 1

    def get(self, info: BlobInfo, make: Callable[[], tuple[T, int]]) -> T:
        """``make()`` returns the value and the generation it was read at; only a match is kept."""
        key = (info.bucket, info.name, info.generation)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries[key] = (hit[0], hit[1], self._pass)
                self._entries.move_to_end(key)
                return hit[1]
        value, generation = make()
        if generation == info.generation:
            self._keep(key, value, footprint(value) + footprint(key))
        return value

    def put(self, info: BlobInfo, value: Any) -> None:
        """What was made of the object at ``info.generation``, known without a read (a write's own)."""
        key = (info.bucket, info.name, info.generation)
        self._keep(key, value, footprint(value) + footprint(key))

    def drop(self, info: BlobInfo) -> None:
        """Let go of what is held for the object at ``info.generation``, if anything."""
        with self._lock:
            held = self._entries.pop((info.bucket, info.name, info.generation), None)
            if held is not None:
                self.size -= held[0]

    def peek(self, info: BlobInfo) -> Any:
        """What is held for the object at the listed generation (None: nothing), as it is: no use
        counted (``controller.service.snapshot`` writes it out)."""
        with self._lock:
            hit = self._entries.get((info.bucket, info.name, info.generation))
        return hit[1] if hit is not None else None

    def _keep(self, key: tuple[str, str, int], value: Any, size: int) -> None:
        with self._lock:
            if key in self._entries or size > self.max_bytes:
                return
            # Oldest use first: the front is what has gone unused longest; once it was used by this
            # pass or the one before (still being read by a pass over every job), so was the rest.
            while self.size + size > self.max_bytes:
                oldest, (held, _, used) = next(iter(self._entries.items()))
                if self._pass and used >= self._pass - 1:
                    return
                del self._entries[oldest]
                self.size -= held
            self._entries[key] = (size, value, self._pass)
            self.size += size


def footprint(value: object) -> int:
    """Bytes ``value`` holds in memory: ``sys.getsizeof`` of it and of everything it refers to
    (containers, objects' ``__dict__``), each object counted once."""
    seen: set[int] = set()
    total = 0
    stack = [value]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, enum.Enum)):  # shared by every value: not this one's
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, (str, bytes, int, float, datetime)) or obj is None:
            continue
        if isinstance(obj, dict):
            stack += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += obj
        elif hasattr(obj, "__dict__"):
            # Its attributes' names are its class's, the same strings for every instance: not this
            # one's (counted, they made a parsed spec look twice what it holds).
            attributes = vars(obj)
            if id(attributes) not in seen:
                seen.add(id(attributes))
                total += sys.getsizeof(attributes)
                stack += attributes.values()
    return total


class Observer:
    def __init__(self, store: BlobStore, compute: ComputeGateway, bucket: str, policy: ControllerPolicy,
                 workers: int = 1, advisor: CapacityAdvisor | None = None, tpu: TpuGateway | None = None,
                 tpu_timeout: float = TPU_LIST_TIMEOUT, replayable: bool = False, chunk: int = CHUNK,
                 snapshot: bool = False, slices: TpuGateway | None = None) -> None:
        self.store = store
        self.chunk = chunk  # jobs of a pass over every job read, planned and acted on together
        # Every read on the pass's own thread, in order, the TPU listing unbounded: what a seeded
        # simulation needs to replay exactly (tests/chaos); a deployed pass bounds it on a thread.
        self.replayable = replayable
        self.tpu_timeout = tpu_timeout  # seconds the TPU listing may take before TPU jobs are blind this pass
        self.compute = compute
        self.tpu = tpu
        self.slices = slices  # TPU slices in Compute Engine (instances and MIGs), listed beside TPU nodes
        self.bucket = bucket
        self.policy = policy
        self.workers = workers  # jobs observed side by side (fanout.each)
        self.parsed = Parsed()
        # What passes over every job made of specs, statuses and VM records, kept in the bucket for
        # a fresh instance's first pass (controller.service.snapshot); None: not kept.
        self.snapshot = Snapshot(store, bucket) if snapshot else None
        self._listed: tuple[dict[str, dict[str, BlobInfo]], Shard | None] | None = None  # the last such pass's
        self._written: dict[str, BlobInfo] = {}  # statuses written since that pass listed (``remember``)
        # Each status's newest generation this process wrote (``remember``): a listing that names an
        # older one was made before the write, and that job is read, never judged on what it was.
        self._wrote: dict[str, int] = {}
        self.advice = AdviceCache(advisor)  # kept between passes, like ``parsed``
        self.tpu_zones = TpuZones(store, bucket)
        self.slice_zones = TpuZones(store, bucket, SLICES_KEY)

    def world(self, job: str | None = None, shard: Shard | None = None) -> World:
        """Everything the planner needs, for every job or for one (``parts``, joined)."""
        chunks, rest = self.parts(job, shard)
        world = World({})
        for chunk in chunks:
            world = world.joined(chunk)
        return world.joined(rest())

    def parts(self, job: str | None = None, shard: Shard | None = None) -> tuple[Iterator[World], Callable[[], World]]:
        """The world in parts: the VM jobs' chunk by chunk (``chunk`` jobs each), each ready to be
        acted on before the next is read, and a call for the rest, made once every chunk was taken,
        which waits for the TPU listing (within its bound): the TPU jobs' views, those of names
        with neither spec nor status (strays, orphans of either kind), runs that have launched
        nothing yet, and jobs whose status records a project the policy no longer watches. A TPU API
        that does not answer never holds a VM job's recovery, however many workers a pass has.

        A pass over every job holds one chunk's statuses at a time, never the fleet's: its memory
        is bounded by the chunk and by what changed (the listing and the instance list are a few
        hundred bytes a job). Its instance list is asked for right after the bucket listing, beside
        the first chunk's reads, so each status must be the generation listed before it (see the
        module docstring): one that moved since is the job of a pass that committed meanwhile, and
        that job is observed again alone, in its own order, with the rest.

        A pass over every job runs jobs side by side, each job's reads one after another; a
        pass for one job (an event: its latency is the point) runs that job's reads side by side.

        ``shard`` (a pass over every job): only that shard's jobs (controller.core.shards), from the
        listing the tick handed it when there is one, and only the VMs labelled for that shard. The
        order above holds, the more so: the handed listing was made before this pass began, each
        status read at its listed generation, one replaced since observed again alone. A job that
        is not the shard's is left out whatever the listing holds (a stale or hostile message), and
        so are VMs and TPU nodes of other shards' jobs (a TPU zone's listing holds every job's). A
        job whose running attempt's VMs the shard's list does not show (made before sharding: no
        label) is looked for in its own zones, or, for more than ``ALONE_MAX`` such jobs in a chunk,
        in one list of every managed VM, before a VM is ever judged lost.
        """
        if job is None:
            self.parsed.begin()
            if self.snapshot is not None:
                self.snapshot.load(shard, self.workers)
        # This pass's sweeps: a pass over every job reads all their slots from one listing; a pass for
        # one job, its sweep's when it is a trial. Never another pass's (a replan inside a tick is a pass).
        sweeps = self._all_sweeps() if job is None else _Sweeps(self._read_slots)
        listing = self._listing(job, shard)
        if job is None:
            self._listed, self._written = (listing, shard), {}
        failed = _Failed()  # each job's own key: safe to fill from several threads
        # A name with neither spec nor status has nothing to read: only its oldest VM records, to
        # be cleaned up, and its instances (orphans), which the instance list finds below.
        strays = _strays(listing)
        order = sorted(n for n, objects in listing.items() if _ours(objects)) if job is None else [job]
        side = 1 if job is None else min(self.workers, _ONE_JOB)  # workers=1: inline, in order
        # One job's instances come from zonal lists of the zones its view names: after its reads.
        found = None if job is not None else _Background(lambda: self._instances(None, {}, shard),
                                                         inline=self.replayable)
        later: dict[str, JobView] = {}  # acted on in ``rest``
        acted: set[str] = set()  # names handed out in chunks
        moved: list[str] = []  # statuses replaced since the listing: observed again alone
        state: dict[str, Any] = {"found": None, "done": False}

        def instances(views: dict[str, JobView]) -> InstanceList:
            if state["found"] is None:
                state["found"] = found.wait() if found is not None else self._instances(job, views)
            return state["found"]

        def chunks() -> Iterator[World]:
            for start in range(0, len(order), self.chunk):
                names_ = order[start:start + self.chunk]
                observed = fanout.each(names_, lambda n: self._guarded(
                    failed, n, self._bucket_view, n, listing.get(n, {}), side), self.workers, shared=job is None)
                views: dict[str, JobView] = {}
                for name, view in zip(names_, observed, strict=True):
                    if view is None:
                        continue
                    listed = listing.get(name, {}).get("status")
                    if job is None and listed is not None and view.status_generation != listed.generation:
                        moved.append(name)
                    else:
                        views[name] = view
                for name in views.keys() & strays.keys():
                    views[name] = replace(views[name], **strays[name])
                seen = instances(views)
                unreachable, unseen, why = tuple(seen.unreachable), tuple(sorted(seen.failed_projects)), \
                    dict(seen.failed_projects)
                # A job whose spec is gone or invalid but whose status is there is judged here too
                # (it ends, or deletes what its run left, from the instance list alone): a fleet of
                # finished jobs whose specs were deleted, or of specs a policy change made invalid,
                # would otherwise be held whole in the rest, every status parsed at once.
                now = {n for n, v in views.items() if (v.spec is not None or v.status is not None) and not _on_tpu(v)
                       and not _new_run(v) and (job is not None or _watched(v, self.policy))}
                later.update({n: v for n, v in views.items() if n not in now})
                if not now:
                    continue
                mine: dict[str, list[Instance]] = defaultdict(list)
                for instance in seen.instances:
                    if instance.job in now:
                        mine[instance.job].append(instance)
                first = {n: replace(views[n], instances=tuple(mine.get(n, ())), unreachable=unreachable,
                                    unseen_projects=unseen, unseen_why=why) for n in sorted(now)}
                if shard is not None and not shard.sweep:
                    first = self._unlabelled(first, failed, state)
                acted.update(first)
                with_evidence = fanout.each(list(first), lambda n: self._guarded(
                    failed, n, self._evidence, first[n], side, sweeps), self.workers, shared=job is None)
                done = dict(zip(first, with_evidence, strict=True))
                yield World({n: v for n, v in done.items() if v}, unreachable, why, failed, failed.transient)
            state["done"] = True

        def rest() -> World:
            if not state["done"]:
                raise RuntimeError("Observer.parts: rest() before every chunk was taken")
            for name, records in strays.items():
                if name not in acted and name not in later:
                    later[name] = JobView(job=name, cancelled="cancel" in listing[name], **records)
            for name in sweeps.holders if job is None else ():  # a trial whose folder is gone whole: its slot
                if name not in acted and name not in later and name not in moved and name not in failed \
                        and (shard is None or shard.owns(name)):
                    later[name] = JobView(job=name)
            seen = instances(later)
            unreachable, unseen, why = tuple(seen.unreachable), tuple(sorted(seen.failed_projects)), \
                dict(seen.failed_projects)
            # Only now, after every status was read, the TPU nodes, and the VMs in projects only a
            # status records; each list with its own bound, inline only where a simulation must
            # replay (``replayable``), never unbounded in a deployed pass.
            tpu_list = _Background(lambda: self._tpu_nodes(job, later), inline=self.replayable)
            # The orphan search in the zones respawn/tpu-zones.json records is a listing of its own,
            # within the same bound: however many zones the record names (anyone who can write the
            # bucket can write it), it never makes the TPU jobs blind; past the bound its nodes are
            # looked for again next pass.
            orphan_list = _Background(lambda: self._recorded_tpu_nodes(job, later), inline=self.replayable)
            recorded = self._recorded_instances(later) if job is None else InstanceList([])
            unseen = tuple(sorted({*unseen, *recorded.failed_projects}))
            why = {**why, **recorded.failed_projects}
            by_api = tpu_list.result(self.tpu_timeout, lambda: self._tpu_unanswered(job, later))
            tpus = _merged(by_api["tpu"], by_api["compute"])
            listed = {(n.project, n.zone, n.name) for n in tpus.nodes}
            orphans = orphan_list.result(self.tpu_timeout, list)
            tpus = replace(tpus, nodes=[*tpus.nodes, *(n for n in orphans if (n.project, n.zone, n.name) not in listed)])
            by_job: dict[str, list[Instance]] = defaultdict(list)
            for instance in [*seen.instances, *recorded.instances, *(node.as_instance() for node in tpus.nodes)]:
                if instance.job and instance.job not in failed and instance.job not in acted \
                        and instance.job not in moved and (shard is None or shard.owns(instance.job)):
                    by_job[instance.job].append(instance)
            views = dict(later)
            for name, its in by_job.items():
                views[name] = replace(views.get(name) or JobView(job=name), instances=tuple(its))
            # A TPU list that failed blinds the TPU jobs alone: a project without the TPU API, or
            # a zone without TPUs, says nothing about VMs.
            tpu_unreachable = tuple(dict.fromkeys((*unreachable, *tpus.unreachable)))
            tpu_why = {**{p: f"TPU nodes: {w}" for p, w in tpus.failed_projects.items()}, **why}
            # A job whose folder is gone whole says nothing of what it ran on: a TPU node of it may be
            # there unseen, holding quota (and its sweep slot), so a failed TPU list blinds it too.
            views = {n: replace(v, unreachable=tpu_unreachable, **_tpu_blind(v, by_api, unseen, why),
                                denied_zones=tpus.denied)
                     if _on_tpu(v) or (not v.has_spec and v.status is None)
                     else replace(v, unreachable=unreachable, unseen_projects=unseen, unseen_why=why)
                     for n, v in views.items()}
            order_ = sorted(views)
            found_views = fanout.each(order_, lambda n: self._guarded(failed, n, self._evidence, views[n], side,
                                                                       sweeps), self.workers)
            done = dict(zip(order_, found_views, strict=True))
            world = World({n: v for n, v in done.items() if v}, tpu_unreachable, tpu_why, failed, failed.transient)
            for name in moved:  # committed by another pass since the listing: looked at again, alone
                try:
                    world = world.joined(self.world(name))
                except Exception as e:  # noqa: BLE001 - its own listing failed: this job's trouble, never the pass's
                    self._guarded(failed, name, _raise, e)
                    world = world.joined(World({}, failed={name: failed[name]},
                                               transient=frozenset({name} & failed.transient)))
            return world

        return chunks(), rest

    def _recorded_instances(self, views: dict[str, JobView]) -> InstanceList:
        """The VMs of jobs whose status records a project the policy no longer watches, from those
        projects: a project dropped from the policy may still hold such a job's VMs, which must be
        found to be deleted. Only those jobs' VMs are kept: nothing else there is ever judged."""
        recorded = {v.job: v.status.project for v in views.values() if not _watched(v, self.policy)}
        if not recorded:
            return InstanceList([])
        found = self.compute.list_managed(tuple(sorted(set(recorded.values()))), None)
        for project, why in found.failed_projects.items():
            log.warning("could not list instances", extra={"json_fields": {"project": project, "error": why}})
        return replace(found, instances=[i for i in found.instances if recorded.get(i.job or "") == i.project])

    def _unlabelled(self, views: dict[str, JobView], failed: _Failed, state: dict[str, Any]) -> dict[str, JobView]:
        """A shard's views, each job whose running attempt's VMs its list does not show given the
        VMs of its own zones (the shard's list finds only labelled VMs; one made before sharding
        has no label): never judged lost for want of a label. More than ``ALONE_MAX`` such jobs
        in a chunk (the first pass after sharding was switched on) are looked for in one list of
        every managed VM, made once a pass, rather than in a zonal list each."""
        missing = [n for n, v in views.items() if _expects_vms(v)]
        if not missing:
            return views
        out = dict(views)
        if len(missing) > ALONE_MAX or state.get("every") is not None:
            if state.get("every") is None:
                every = self.compute.list_managed(self.policy.watched_projects, None)
                state["every"] = every
            every = state["every"]
            for n in missing:
                its = tuple(i for i in every.instances if i.job == n)
                out[n] = replace(views[n], instances=its,
                                 unreachable=tuple(dict.fromkeys((*views[n].unreachable, *every.unreachable))))
            return out
        alone = fanout.each(missing, lambda n: self._guarded(failed, n, self._alone, views[n]), self.workers)
        for n, view in zip(missing, alone, strict=True):
            if view is None:
                del out[n]
            else:
                out[n] = view
        return out

    def _alone(self, view: JobView) -> JobView:
        found = self._instances(view.job, {view.job: view})
        return replace(view, instances=tuple(i for i in found.instances if i.job == view.job),
                       unreachable=tuple(dict.fromkeys((*view.unreachable, *found.unreachable))))

    def _instances(self, job: str | None, views: dict[str, JobView], shard: Shard | None = None) -> InstanceList:
        # A job name from an event's object name goes into a Compute filter: only a valid
        # one does. No instance can carry an invalid one, since respawn never creates it.
        if job is not None and names.job_name_problem(job):
            return InstanceList([])
        # Besides the policy's projects, the project a job of this bucket (it has a spec)
        # recorded in its status: a project dropped from the policy may still hold that
        # job's VMs, which must be found to be deleted. Only that job's VMs are kept from
        # such a project: nothing else there is ever judged, let alone deleted as an orphan.
        recorded = {v.job: v.status.project for v in views.values()
                    if v.has_spec and v.status and v.status.project
                    and v.status.project not in self.policy.watched_projects}
        projects = tuple(dict.fromkeys((*self.policy.watched_projects, *sorted(set(recorded.values())))))
        found = self._job_instances(views[job]) if job is not None and job in views else None
        if found is None and shard is not None:
            # A shard's VMs by their label; a sweep's, every managed VM (those made before sharding
            # carry no label), each kept by the shard its job's name hashes to.
            found = self.compute.list_managed(projects, None, shard=None if shard.sweep else (shard.index, shard.count))
            found = replace(found, instances=[i for i in found.instances if shard.owns(i.job)])
        if found is None:
            found = self.compute.list_managed(projects, job)
        for project, why in found.failed_projects.items():
            log.warning("could not list instances", extra={"json_fields": {"project": project, "error": why}})
        kept = [i for i in found.instances
                if i.project in self.policy.watched_projects or recorded.get(i.job or "") == i.project]
        return replace(found, instances=kept)

    def _tpu_unanswered(self, job: str | None, views: dict[str, JobView]) -> dict[str, TpuList]:
        """What a TPU listing past its bound leaves: every project it would have listed, not seen."""
        why = f"TransientError: the TPU API did not answer within {self.tpu_timeout:g}s"
        return {api: TpuList([], failed_projects={p: why for p in self._tpu_targets(job, views, api)[0]})
                for api in ("tpu", "compute")}

    def _tpu_nodes(self, job: str | None, views: dict[str, JobView]) -> dict[str, TpuList]:
        """The TPU nodes of the jobs that run, or ran, on TPUs, from the zones they can be in.

        TPU v2 has no aggregated list: each zone is listed. The zones are those of the specs
        that ask for a TPU, and every zone a status that ever had one names (its history
        included), so a node is found to be deleted wherever it was created. (A node whose job
        folder was deleted whole is looked for by ``_recorded_tpu_nodes``.) Compute Engine's TPU slices
        are listed beside them, by project (aggregated lists). By API: a listing of one that fails
        blinds the jobs on that API alone (``_tpu_blind``)."""
        by_api: dict[str, TpuList] = {}
        for gateway, api in ((self.tpu, "tpu"), (self.slices, "compute")):
            projects, zones, recorded = self._tpu_targets(job, views, api)
            if gateway is None or not projects or (api == "tpu" and not zones):
                by_api[api] = TpuList([])
                continue
            try:
                found = gateway.list_nodes(tuple(projects), tuple(zones), job)
            except errors.RespawnError as e:  # the TPU jobs wait (blind); the VM jobs go on
                found = TpuList([], failed_projects={p: _short(e) for p in projects})
            for project, why in found.failed_projects.items():
                log.warning("could not list TPU nodes", extra={"json_fields": {"project": project, "api": api,
                                                                               "error": why}})
            # As for VMs: a node in a project no longer watched is kept only for the job whose
            # status records that project.
            by_api[api] = replace(found, nodes=[n for n in found.nodes if n.project in self.policy.watched_projects
                                                or recorded.get(n.job or "") == n.project])
        return by_api

    def _recorded_tpu_nodes(self, job: str | None, views: dict[str, JobView]) -> list[TpuNode]:
        """A pass over every job also lists each zone of a watched project the controller ever
        created a TPU node in (``tpuzones``, recorded before each create) that the jobs' own
        listing does not cover, each project with its own zones only: a node whose job folder was
        deleted whole is found there, and deleted as an orphan. An event for a run that has
        launched nothing yet lists them too (for that job): a node an earlier run of its name
        left is then seen before the first launch. What fails is logged, never blinds a job (a
        TPU problem never holds a VM job; a job's own zones are listed by ``_tpu_nodes``)."""
        if job is not None and not _new_run(views.get(job)):
            return []
        nodes: list[TpuNode] = []
        for gateway, record, api in ((self.tpu, self.tpu_zones, "tpu"), (self.slices, self.slice_zones, "compute")):
            if gateway is not None:
                nodes += self._recorded(gateway, record, api, job, views)
        return nodes

    def _recorded(self, gateway: TpuGateway, record: TpuZones, api: str, job: str | None,
                  views: dict[str, JobView]) -> list[TpuNode]:
        """One API's share of ``_recorded_tpu_nodes`` (a Compute Engine slice's project is listed
        whole: its list is aggregated, so a project listed for the jobs covers its recorded zones)."""
        try:
            pairs = record.read()
        except errors.RespawnError as e:
            log.warning("could not read the TPU zones record", extra={"json_fields": {"error": str(e)}})
            return []
        projects, zones, _ = self._tpu_targets(job, views, api)
        extra: dict[str, list[str]] = defaultdict(list)
        for project, zone in sorted(pairs):
            if project in self.policy.watched_projects and not (project in projects
                                                                and (api == "compute" or zone in zones)):
                extra[project].append(zone)
        nodes: list[TpuNode] = []
        for project, its_zones in extra.items():
            try:
                found = gateway.list_nodes((project,), tuple(its_zones), job)
            except errors.RespawnError as e:
                log.warning("could not list TPU nodes in recorded zones",
                            extra={"json_fields": {"project": project, "error": _short(e)}})
                continue
            if found.failed_projects or found.unreachable:
                log.warning("could not list TPU nodes in recorded zones", extra={"json_fields": {
                    "project": project, "errors": dict(found.failed_projects), "unreachable": list(found.unreachable)}})
            nodes += [n for n in found.nodes if n.project == project]
        return nodes

    def _tpu_targets(self, job: str | None, views: dict[str, JobView], api: str = "tpu",
                     ) -> tuple[dict[str, None], dict[str, None], dict[str, str]]:
        """(projects, zones) to list one API's TPU nodes in (``api``: "tpu", the Cloud TPU API's;
        "compute", Compute Engine's slices), and the project each job's status records."""
        if (self.tpu if api == "tpu" else self.slices) is None or (job is not None and names.job_name_problem(job)):
            return {}, {}, {}
        chosen = [views[job]] if job is not None and job in views else [] if job is not None else list(views.values())
        zones: dict[str, None] = {}
        projects: dict[str, None] = {}
        recorded: dict[str, str] = {}
        for v in chosen:
            spec, st = v.spec, v.status
            if spec is not None and spec.tpu is not None and spec.tpu.api == api:
                zones.update(dict.fromkeys(spec.zones))
                projects[self.policy.project_of(spec)] = None
            if st is not None and (st.tpu if api == "tpu" else st.tpu_compute):
                zones.update(dict.fromkeys(z for z in (st.zone, *(e.zone for e in st.history)) if z))
                if st.project:
                    projects[st.project] = None
                    recorded[v.job] = st.project
                else:  # a status from before runs kept their project: wherever the policy lets it be
                    projects.update(dict.fromkeys(self.policy.watched_projects))
        return projects, zones, recorded

    def _job_instances(self, view: JobView) -> InstanceList | None:
        """One job's instances from zonal lists of the only zones they can be in, or None.

        A VM of this job exists only where its status said it would go before it was
        inserted: every insert follows a committed status write naming its zone (the
        attempt's, ``zone``; a standby's, ``standby.zone``), and a pass whose view is stale
        cannot insert (the executor re-checks the generation first). So the zones the status
        and its history name, in the projects it and the spec name, hold every VM it can
        have; the spec's other zones cannot. Listing those zones costs a zonal list each,
        side by side, where an aggregated list takes seconds: this is the event path's
        speed, and after a mass preemption each list counts against Compute's list quota
        (1,500 a minute), so a two-zone spec costs one, not two. A job without a valid
        spec, or whose run has launched nothing yet, gets the aggregated list (its VMs may
        be anywhere it once ran). What an event pass cannot see (an older run's VM in a
        zone its history no longer names) the tick's aggregated list finds.
        """
        spec, st = view.spec, view.status
        if spec is None or spec.project is None:
            return None
        if st is None or st.attempt_started_at is None or not st.zone:
            # A run that has launched nothing yet: an earlier run of the same name, its folder
            # deleted whole (status and all), may still have a VM in a zone this spec does not
            # name. Its first launch looks everywhere, as a tick does (the aggregated list).
            return None
        known = [st.zone, *([st.standby.zone] if st.standby else []), *(e.zone for e in st.history)]
        zones = tuple(dict.fromkeys(z for z in known if z))
        recorded = [st.project, *([st.standby.project] if st.standby else [])]
        projects = tuple(dict.fromkeys([spec.project, *(p for p in recorded if p)]))
        return self.compute.list_managed(projects, view.job, zones=zones)

    @staticmethod
    def _guarded(failed: _Failed, job: str, step: Callable[..., JobView], *args: Any) -> JobView | None:
        """One job's observation step; its trouble, whatever it is, is recorded and never stops the pass."""
        try:
            return step(*args)
        except errors.RespawnError as e:
            failed[job] = f"{type(e).__name__}: {e}"
            if isinstance(e, errors.TransientError):
                failed.transient.add(job)
            log.warning("could not observe job", extra={"json_fields": {"job": job, "error": str(e)}})
        except Exception as e:  # noqa: BLE001 - a bug or a library surprise: this job only
            failed[job] = f"{UNEXPECTED} {type(e).__name__}: {e}"
            log.exception("could not observe job", extra={"json_fields": {"job": job}})
        return None

    def _stopped(self, view: JobView, seen: Instance | None, name: str) -> Stopped:
        """Why a node of the current attempt is down or gone, and when: a TPU node's own state
        says why (Compute's operations know nothing of Cloud TPU nodes), and a Compute Engine
        slice's also when (its adapter asked Compute's operations); a VM's, Compute's operations."""
        st = view.status
        assert st is not None and st.project and st.zone
        if seen is not None and seen.tpu:  # a Compute Engine slice's host: when Compute recorded it, too
            return Stopped(seen.stop_reason or StopReason.UNKNOWN, seen.stopped_at)
        if seen is None and st.attempt_tpu:
            return Stopped()  # a TPU node deleted by someone else: gone, no record of why
        return self.compute.stopped(st.project, st.zone, name)

    def with_checkpoint(self, view: JobView) -> JobView:
        """The view plus its latest complete checkpoint (listed only when a plan needs it).

        A prefix that cannot be listed (a typo in the bucket name, missing IAM, an outage)
        is a fact about this job, carried to the planner, which says so in its status.
        """
        spec = view.spec
        if spec is None or spec.checkpoint is None:
            return view
        # Where this run's checkpoints are: a fresh run's own prefix, never an earlier run's saves.
        where = view.status.checkpoints(spec.checkpoint) if view.status is not None else spec.checkpoint
        try:
            found = discover(self.store, where)
        except errors.RespawnError as e:
            log.warning("cannot list checkpoints", extra={"json_fields": {"job": view.job, "error": str(e)}})
            return replace(view, checkpoint=None, checkpoint_loaded=True, checkpoint_error=_short(e))
        ref = CheckpointRef.of(found) if found else None
        return replace(view, checkpoint=ref, checkpoint_loaded=True, checkpoint_error=None)

    def _checkpoint_fields(self, view: JobView) -> dict[str, Any]:
        loaded = self.with_checkpoint(view)
        return {"checkpoint": loaded.checkpoint, "checkpoint_loaded": loaded.checkpoint_loaded,
                "checkpoint_error": loaded.checkpoint_error}

    def with_advice(self, view: JobView, model: str, project: str) -> JobView:
        """The view plus Compute's capacity advice for its zones, for an attempt on ``model``.

        Asked only when a plan launches under capacity placement, and answered from a cache
        shared by every job of the shape; any failure leaves the spec's order (logged once)."""
        if view.spec is None:
            return view
        try:
            found = self.advice.advise(placement.shapes(view.spec, model, project))
        except errors.RespawnError as e:
            return replace(view, advice=None, advice_model=model, advice_loaded=True, advice_error=_short(e))
        return replace(view, advice=found, advice_model=model, advice_loaded=True, advice_error=None)

    def with_fresh_records(self, view: JobView) -> JobView:
        """The marker and exit record read again now, after the instance list.

        Used before restarting a VM that looked alive (recycle, stale heartbeat): its exit
        record may have landed since the listing, and an ``exit 0`` must never be lost.
        """
        marker = self._reread(view.marker, names.marker_key(view.job))
        exit_ = self._reread(view.exit, names.exit_key(view.job))
        node_exits = view.node_exits
        if _ranks(view.status, view.spec) > 1 or node_exits:
            # Listed after rank 0's record was read: a worker's failure that landed before it is
            # in this listing (GCS lists consistently), so an exit 0 never hides an earlier failure.
            listed = {ref.node: info for info in self.store.list(self.bucket, names.node_exits_prefix(view.job))
                      if (ref := names.parse_object_name(info.name)) and ref.job == view.job and ref.node}
            node_exits = self._node_exits(view.status, view.spec, listed)
        return replace(view, marker=marker, exit=exit_, node_exits=node_exits, records_fresh=True)

    def _reread(self, known: Record | None, key: str) -> Record | None:
        """The record at ``key`` now: one metadata request while it is still the generation
        read before (a generation's bytes never change), else read whole."""
        if known is not None and known.attempt is not None:  # an unreadable one is judged afresh
            try:
                if self.store.stat(self.bucket, key).generation == known.generation:
                    return known
            except errors.NotFound:
                return None  # consumed since it was read
        return self._read_record(key)

    def remember(self, info: BlobInfo, data: bytes, replaced: int) -> None:
        """A status this process wrote (``data``, now generation ``info.generation``, in place of
        ``replaced``), kept as a read of it would have been: the next pass does not read back what
        this one decided. The generation it replaced is let go: a listing made before the write
        names it, and its job must be read again as it is now (``parts``: observed again alone),
        never judged on what it was."""
        self.parsed.drop(replace(info, generation=replaced))
        head, past, lengths = JobStatus.split(data)
        self.parsed.put(info, ((zlib.compress(head, 1), zlib.compress(past, 1), lengths), info.generation))
        self._written[info.name] = info
        self._wrote[info.name] = max(self._wrote.get(info.name, 0), info.generation)

    def keep_snapshot(self) -> int:
        """After a pass over every job that acted to its end: the parts of the snapshot that changed
        enough, written from the cache (controller.service.snapshot), with the statuses the pass
        wrote at their new generations. Returns the parts written."""
        if self.snapshot is None or self._listed is None:
            return 0
        (listing, shard), self._listed = self._listed, None
        written, self._written = self._written, {}
        newest = dict(listing)
        for name, info in written.items():
            ref = names.parse_object_name(name)
            if ref is not None and ref.job in newest:
                listed = newest[ref.job].get("status")
                if listed is None or listed.generation < info.generation:
                    newest[ref.job] = {**newest[ref.job], "status": info}
        return self.snapshot.save(newest, self.parsed.peek, shard, self.workers)

    def list_bucket(self, job: str | None = None) -> list[BlobInfo]:
        """The objects of every job (or one) as the bucket lists them: jobs/ and preempted-jobs/."""
        jobs_prefix = names.JOBS_PREFIX + (f"{job}/" if job else "")
        markers_prefix = names.marker_key(job) if job else names.MARKERS_PREFIX
        listed = fanout.each((jobs_prefix, markers_prefix), lambda prefix: self.store.list(self.bucket, prefix),
                             min(2, self.workers))
        return [*listed[0], *listed[1]]

    def _listing(self, job: str | None, shard: Shard | None = None) -> dict[str, dict[str, BlobInfo]]:
        if job is None and shard is not None and shard.listing is not None:
            infos: list[BlobInfo] = [i for i in shard.listing if i.bucket == self.bucket]
        else:
            infos = self.list_bucket(job)
        out: dict[str, dict[str, BlobInfo]] = defaultdict(dict)
        for info in infos:
            ref = names.parse_object_name(info.name)
            if ref and (job is None or ref.job == job) and (job is not None or shard is None or shard.owns(ref.job)):
                out[ref.job][ref.kind if ref.node is None else f"{ref.kind}/{ref.node}"] = info
        return out

    def _bucket_view(self, job: str, objects: dict[str, BlobInfo], side: int = 1) -> JobView:
        """The job's objects as listed, each read (``side`` at a time) unless the cache has its generation."""
        # Records of a name with neither spec nor status are never acted on (its VMs, if
        # any, are orphans found by the instance list): not read, so that junk objects
        # under many names cannot make a tick read them all (``_strays`` cleans them up).
        ours = _ours(objects)
        reads: dict[str, Callable[[], Any]] = {"status": lambda: self._status(objects.get("status"))}
        if ours:
            reads.update({kind: (lambda k=kind: self._record(objects.get(k))) for kind in _RECORD_KINDS})
            reads["heartbeat"] = lambda: self._heartbeat(objects.get("heartbeat"))
        if "spec" in objects:
            info = objects["spec"]
            reads["spec"] = lambda: self.parsed.get(info, lambda: self._judge_spec(job, info))
        got = dict(zip(reads, fanout.each(reads.values(), lambda read: read(), side), strict=True))
        status, generation = got["status"]
        view = JobView(job=job, cancelled="cancel" in objects, status=status, status_generation=generation,
                       marker=got.get("marker"), exit=got.get("exit"), heartbeat=got.get("heartbeat"),
                       notice=got.get("notice"), ready=got.get("ready"))
        if "spec" in objects:
            spec, problems, _ = got["spec"]
            view = replace(view, spec=spec, problems=problems, spec_generation=objects["spec"].generation)
        workers = {int(kind[5:]): info for kind, info in objects.items() if kind.startswith("exit/")}
        if ours and workers:  # after the status: which ranks its attempt has bounds what is read
            view = replace(view, node_exits=self._node_exits(status, view.spec, workers, side))
        return view

    def _node_exits(self, status: JobStatus | None, spec: JobSpec | None, listed: dict[int, BlobInfo],
                    side: int = 1) -> tuple[Record, ...]:
        """Each worker's exit record, by rank: read (``side`` at a time, the cache first) for a rank
        the current attempt has; any other judged on its listing alone, to be cleaned up, at
        most MAX_UNREAD_NODE_EXITS a pass, oldest first. So a flood of rank names costs no read."""
        ranks = _ranks(status, spec)
        mine = sorted(rank for rank in listed if rank < ranks)
        got = fanout.each(mine, lambda rank: self._record(listed[rank]), side)
        read = [replace(record, node=rank) for rank, record in zip(mine, got, strict=True) if record]
        others = heapq.nsmallest(MAX_UNREAD_NODE_EXITS, (rank for rank in listed if rank >= ranks),
                                 key=lambda rank: (listed[rank].updated, rank))
        why = f"rank {{}} is not one of attempt {status.attempt}'s" if status else "rank {} of no attempt (no status)"
        return (*read, *(Record.unread(listed[rank], why.format(rank), rank) for rank in others))

    def _judge_spec(self, job: str, info: BlobInfo) -> tuple[tuple[JobSpec | None, tuple[str, ...], bytes | None], int]:
        """(the policy-resolved spec or None, its problems, the bytes judged), and the generation read."""
        too_large = (f"spec.yaml: larger than the {MAX_SPEC_BYTES // 1024} KiB limit; shrink it",)
        if info.size > MAX_SPEC_BYTES:  # the listing says so: not even a request for it
            return (None, too_large, None), info.generation
        kept = self.snapshot.spec(info) if self.snapshot is not None else None
        try:
            blob = Blob(info, kept) if kept is not None else self._read_listed(info, MAX_SPEC_BYTES)
        except errors.TooLarge:  # grew since the listing
            return (None, too_large, None), 0
        try:
            spec = parse_spec(blob.data, job)
        except SpecError as e:
            return (None, tuple(e.problems), blob.data), blob.info.generation
        if problems := tuple(self.policy.violations(spec)):
            return (None, problems, blob.data), blob.info.generation
        # From here on the spec says exactly where and as whom VMs run: the project and
        # service account filled in from the policy, never from status.json.
        return (self.policy.resolve(spec), (), blob.data), blob.info.generation

    def _read_listed(self, info: BlobInfo, limit: int) -> Blob:
        """The listed generation in one request, or, replaced since, what is there now."""
        try:
            return Blob(info, self.store.read_listed(info))
        except errors.NotFound:
            return self.store.read(self.bucket, info.name, limit=limit)

    def _status(self, info: BlobInfo | None) -> tuple[JobStatus | None, int]:
        if info is None:
            return None, 0

        def read() -> tuple[tuple[tuple[bytes, bytes, tuple[int, int]] | None, int], int]:
            if self.snapshot is not None and (kept := self.snapshot.status(info)) is not None:
                return (kept, info.generation), info.generation
            return read_object()

        def read_object() -> tuple[tuple[tuple[bytes, bytes, tuple[int, int]] | None, int], int]:
            raw, generation = self._read_status(info)
            if raw is None:
                return (None, generation), generation
            head, past, lengths = JobStatus.split(raw)
            return ((zlib.compress(head, 1), zlib.compress(past, 1), lengths), generation), generation

        # Kept as its bytes, compressed, and its head parsed on each pass, its history and past runs
        # only if the pass uses them (``JobStatus.joined``): parsed whole, a status at its history
        # limit takes about 220 KiB and 1 ms, and 10,000 of them would not fit a function; its 55 KB
        # of JSON compress to about 7 KiB.
        # A generation older than one this process wrote was listed before the write: what a read
        # gives now (another generation: ``parts`` observes the job again alone), never the cache's
        # or the snapshot's entry for it (a part read after the write still holds it).
        older = info.generation < self._wrote.get(info.name, 0)
        for tries_left in (1, 0):
            packed, generation = read_object()[0] if older else self.parsed.get(info, read)
            if packed is None:
                return None, generation
            head, past, lengths = packed
            try:
                if isinstance(packed, snapshot.Unchecked):  # a snapshot's: its past checked when first used
                    return JobStatus.joined(zlib.decompress(head), lambda: snapshot.inflate(past), lengths,
                                            otherwise=lambda: self._past_as_read(info)), generation
                return JobStatus.joined(zlib.decompress(head), lambda: zlib.decompress(past), lengths), generation
            except ValueError:
                # Only a snapshot's entry can fail here (a read's was validated whole before it was
                # kept, and ``remember``'s is the controller's own): let go of it and read the object
                # (the snapshot gives an entry once, so the next ``read`` is a read).
                if not tries_left:
                    raise
                log.warning("a snapshot's status head does not validate; the object is read",
                            extra={"json_fields": {"object": info.name}})
                self.parsed.drop(info)
        raise AssertionError("unreachable")

    def _past_as_read(self, info: BlobInfo) -> bytes:
        """The history and past runs of the status at the listed generation, read, for a snapshot's
        entry whose past did not validate; the entry is let go whatever the read gives. A status
        replaced since, or unreadable, is this pass's trouble for the job (TransientError): the
        next pass reads it as it is then."""
        self.parsed.drop(info)
        raw, generation = self._read_status(info)
        if raw is None or generation != info.generation:
            raise errors.TransientError(f"{info.name}: changed or unreadable since the listing")
        return JobStatus.split(raw)[1]

    def _read_status(self, info: BlobInfo) -> tuple[bytes | None, int]:
        """The status's bytes, once they parse (None: unreadable), and the generation read."""
        generation = info.generation
        try:
            if info.size > MAX_STATUS_BYTES:  # the listing says so: not even a request for it
                raise errors.TooLarge(info.name)
            blob = self._read_listed(info, MAX_STATUS_BYTES)
            generation = blob.info.generation
            JobStatus.from_json(blob.data)
            return blob.data, generation
        except (errors.TooLarge, ValueError, RecursionError):
            # Unreadable or oversized (hand-edited?): start over, overwriting it by
            # compare-and-swap (a generation that moved meanwhile just fails, and the next
            # pass looks again).
            log.warning("unreadable status.json; starting a new run", extra={"json_fields": {"object": info.name}})
            return None, generation

    def _heartbeat(self, info: BlobInfo | None) -> Record | None:
        """The heartbeat as its listing shows it, where its metadata can say (``Record.listed``):
        no request. A trainer beats every minute, so its generation is new on every pass and the
        cache would not spare the read; the listing does. From an older agent: read, as any record."""
        listed = Record.listed(info) if info is not None else None
        return listed if listed is not None else self._record(info)

    def _record(self, info: BlobInfo | None) -> Record | None:
        if info is None:
            return None
        if info.size > MAX_RECORD_BYTES:  # the listing says so: not even a request for it
            return Record.oversized(info)

        def read() -> tuple[tuple[Record | None, bytes | None], int]:
            kept = self.snapshot.record(info) if self.snapshot is not None else None
            if kept is not None:  # the bytes a read would give: judged as a read's
                return (Record.parse(info, kept), kept), info.generation
            record, data = self._read_record_bytes(info.name, info)
            return (record, data), record.generation if record else 0

        # Kept with its bytes, which the snapshot holds (a record parsed is judged again from them).
        return self.parsed.get(info, read)[0]

    def _read_record(self, name: str, listed: BlobInfo | None = None) -> Record | None:
        """The record at ``name``; ``listed``: the generation a listing named, read in one request
        while it is still there."""
        return self._read_record_bytes(name, listed)[0]

    def _read_record_bytes(self, name: str, listed: BlobInfo | None = None) -> tuple[Record | None, bytes | None]:
        """``_read_record``'s record and the bytes it was judged from (None: none read)."""
        try:
            blob = self._read_listed(listed, MAX_RECORD_BYTES) if listed else \
                self.store.read(self.bucket, name, limit=MAX_RECORD_BYTES)
        except errors.NotFound:
            return None, None  # consumed between the listing and the read, or never written
        except errors.TooLarge:
            return Record.oversized(self.store.stat(self.bucket, name)), None
        return Record.parse(blob.info, blob.data), blob.data

    def _evidence(self, view: JobView, side: int, sweeps: _Sweeps) -> JobView:
        """``_with_evidence``, and a sweep's trial's slots (``_with_slots``)."""
        return self._with_slots(self._with_evidence(view, side), sweeps)

    @staticmethod
    def _with_slots(view: JobView, sweeps: _Sweeps) -> JobView:
        """A sweep's trial with its sweep's slots, listed once a pass for all of its trials
        (``sweeps/<sweep>/``: the record and at most ``max_parallel`` slots, each holder read from
        the listing). Every pass that sees a trial reads them: a trial waits QUEUED with no other
        change to wake it, and one that is over gives its slot back. Its sweep is its spec's, else
        its run's (a spec deleted), else, in a pass over every job, the one a slot names it in (its
        folder deleted whole); slots it holds in any other sweep come too (``other_slots``: a spec
        that moved it to another sweep, or out of sweeps), to be given back."""
        current = view.spec.sweep.name if view.spec is not None and view.spec.sweep is not None else \
            view.status.sweep if view.status is not None and view.status.sweep else None
        held = sweeps.sweeps_of(view.job)
        if current is None and view.spec is None and held:
            current = held[0]
        others = tuple(sweeps.get(name) for name in held if name != current)
        if current is None and not others:
            return view
        return replace(view, slots=sweeps.get(current) if current else None, other_slots=others)

    def _read_slots(self, sweep: str) -> Slots:
        try:
            listed = self.store.list(self.bucket, f"{names.SWEEPS_PREFIX}{sweep}/")
        except errors.RespawnError as e:
            return Slots(sweep, None, problem=_short(e))
        return self._slots_of(sweep, listed)

    def _all_sweeps(self) -> _Sweeps:
        """A pass over every job: every sweep's slots from one listing of ``sweeps/``, and who holds
        each, so that a trial whose folder is gone whole (deleted by hand: no spec, no status)
        still gives its slot back once its VMs are gone (``parts``' rest). A listing that fails:
        each trial's sweep is listed on its own instead."""
        try:
            listed = self.store.list(self.bucket, names.SWEEPS_PREFIX)
        except errors.RespawnError as e:
            log.warning("cannot list the sweeps", extra={"json_fields": {"error": str(e)}})
            return _Sweeps(self._read_slots)
        by_sweep: dict[str, list[BlobInfo]] = defaultdict(list)
        for info in listed:
            sweep, _, rest = info.name.removeprefix(names.SWEEPS_PREFIX).partition("/")
            if sweep and rest:
                by_sweep[sweep].append(info)
        return _Sweeps(self._read_slots, {sweep: self._slots_of(sweep, infos) for sweep, infos in by_sweep.items()})

    def _slots_of(self, sweep: str, listed: list[BlobInfo]) -> Slots:
        prefix = names.slots_prefix(sweep)
        # A slot's number as the controller writes it (k < max_parallel <= 256); any other name under
        # slots/ (written by hand) is no slot. A slot with no holder in its metadata holds its place.
        holders = {int(k): ((info.metadata or {}).get(SLOT_HOLDER, ""), info.generation) for info in listed
                   if _SLOT_NUMBER.fullmatch(k := info.name.removeprefix(prefix)) and info.name != k}
        record = next((info for info in listed if info.name == names.sweep_key(sweep)), None)
        if record is None:
            return Slots(sweep, None, holders, problem=f"no gs://{self.bucket}/{names.sweep_key(sweep)}")
        listed_limit = (record.metadata or {}).get(SWEEP_LIMIT_KEY, "")
        if _SLOT_NUMBER.fullmatch(listed_limit) and 1 <= int(listed_limit) <= MAX_PARALLEL:
            return Slots(sweep, int(listed_limit), holders)  # the CLI writes it beside the record: no read
        try:
            limit = self.parsed.get(record, lambda: self._sweep_limit(record))
        except (errors.RespawnError, ValueError) as e:
            return Slots(sweep, None, holders, problem=f"gs://{self.bucket}/{record.name}: {_short(e)}")
        return Slots(sweep, limit, holders)

    def _sweep_limit(self, info: BlobInfo) -> tuple[int, int]:
        """The sweep's ``max_parallel``, and the generation it was read at (``Parsed.get``)."""
        blob = self._read_listed(info, SWEEP_RECORD_LIMIT)
        return SweepRecord.model_validate_json(blob.data).max_parallel, blob.info.generation

    def _with_evidence(self, view: JobView, side: int = 1) -> JobView:
        """For each node of the current attempt that is stopped or gone: fresh records and Compute's why.

        Compute's why comes from Compute's own records of the VM (its zone operations), never from
        a System Event audit entry: a trainer that may write logs can write an entry under that
        log's name too, and a forged "preempted" would excuse its own crash from the failure
        budget. An entry only wakes a pass (``functions.on_audit``).

        Not for a zone the instance list could not see: there "not seen" means nothing.
        With ``side`` > 1 (a pass for this job alone) these reads go side by side, with the
        checkpoint listing the plan will ask for beside them once every lost node is gone or
        off for good: a node still on its way down may yet save a checkpoint and then write
        its marker, so then the listing waits for the plan, after the marker was read.
        """
        st = view.status
        if st is None or st.phase.terminal or not st.zone or not st.project:
            return view
        if st.zone in view.unreachable or st.project in view.unseen_projects:
            return view
        seen = {i.name: i for i in view.instances if i.attempt == st.attempt}
        if not st.inserted and not seen:
            return view  # nothing of this attempt exists yet: nothing was lost
        lost = [n for n in st.instances if n not in seen or not seen[n].status.alive]
        if not lost:
            return view
        # Between attempts (backing off, or waiting for a zone) the loss was judged already:
        # Compute's why changes no plan, and each ask is a list request against the project's
        # per-minute quota (1,000 a tick for 1,000 jobs backing off: two thirds of the default).
        between = judged = st.phase in (Phase.PENDING, Phase.QUEUED, Phase.RECOVERING)
        # A VM's own marker says why it went (the planner reads it before Compute's why), and no
        # exit record of this attempt asks whose fault a loss was: no request for it either
        # (1,000 list requests in a 1,000-VM preemption, past the quota's 1,500 a minute).
        told = view.marker is not None and view.marker.belongs_to(st) and view.deciding_exit(st) is None
        judged = judged or told
        reads: dict[Any, Callable[[], Any]] = {} if judged else {
            n: (lambda n=n: self._stopped(view, seen.get(n), n)) for n in lost}
        # Between attempts no record is read again here either (two requests a pass for each job
        # backing off: 2,000 a tick for 1,000): the loss was judged on records read after the VM
        # was seen down, and a plan that commits a launch asks for them first (planner ``_fresh``).
        if not between:
            reads["records"] = lambda: self.with_fresh_records(view)
        off = all(n not in seen or seen[n].status.down for n in lost)
        if side > 1 and off and view.spec and view.spec.checkpoint and not view.checkpoint_loaded:
            reads["checkpoint"] = lambda: self._checkpoint_fields(view)
        got = dict(zip(reads, fanout.each(reads.values(), lambda read: read(), side), strict=True))
        return replace(got.get("records", view), stop_reasons={n: got[n].reason for n in lost if n in got},
                       stopped_at={n: got[n].at for n in lost if n in got and got[n].at is not None},
                       **got.get("checkpoint", {}))


def _expects_vms(view: JobView) -> bool:
    """A job whose current attempt's VMs should be up (provisioning or running) and are not all in
    the instances its view holds."""
    st = view.status
    if st is None or st.phase not in (Phase.PROVISIONING, Phase.RUNNING) or not st.instances:
        return False
    seen = {i.name for i in view.instances}
    return any(n not in seen for n in st.instances)


def _ours(objects: dict[str, BlobInfo]) -> bool:
    """A job the controller judges: it has a spec or a status."""
    return "spec" in objects or "status" in objects


def _ranks(status: JobStatus | None, spec: JobSpec | None) -> int:
    """How many ranks the current attempt has: its nodes, or its TPU slice's hosts (at most the
    number its type ends in: every host has a chip or more)."""
    if status is None:
        return 0
    ranks = len(status.instances)
    if status.attempt_tpu and spec is not None and spec.tpu is not None:
        ranks = max(ranks, spec.tpu.hosts)
    return ranks


def _strays(listing: dict[str, dict[str, BlobInfo]]) -> dict[str, dict[str, Any]]:
    """The oldest MAX_STRAYS VM records of names with neither spec nor status, never read, as
    ``JobView`` fields by job: the planner deletes those past its grace (``planner._strays``)."""
    found = ((job, kind, info) for job, objects in listing.items() if not _ours(objects)
             for kind, info in objects.items() if kind in _RECORD_KINDS or kind.startswith("exit/"))
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"node_exits": ()})
    for job, kind, info in heapq.nsmallest(MAX_STRAYS, found, key=lambda f: (f[2].updated, f[2].name)):
        if kind.startswith("exit/"):
            node = int(kind[5:])
            out[job]["node_exits"] = (*out[job]["node_exits"], Record.unread(info, "stray", node))
        else:
            out[job][kind] = Record.unread(info, "stray")
    return dict(out)


def _raise(error: BaseException) -> JobView:
    """``error`` raised again, for ``Observer._guarded`` to record as it records any job's."""
    raise error


class _Sweeps:
    """One pass's sweeps (``Observer._with_slots``): each sweep's slots read once, whichever of the
    pass's threads asks first; ``found``: read already (a pass over every job's one listing)."""

    def __init__(self, read: Callable[[str], Slots], found: dict[str, Slots] | None = None) -> None:
        self._read, self._found = read, dict(found or {})
        self._lock = threading.Lock()
        self._by_job: dict[str, list[str]] = defaultdict(list)
        for name, slots in self._found.items():
            for holder, _ in slots.holders.values():
                if holder and name not in self._by_job[holder]:
                    self._by_job[holder].append(name)

    @property
    def holders(self) -> list[str]:
        """Every trial a slot names (a pass over every job's listing)."""
        return sorted(self._by_job)

    def sweeps_of(self, job: str) -> list[str]:
        return list(self._by_job.get(job, ()))

    def get(self, sweep: str) -> Slots:
        with self._lock:
            found = self._found.get(sweep)
        if found is None:
            found = self._read(sweep)
            with self._lock:
                found = self._found.setdefault(sweep, found)
        return found


class _Failed(dict[str, str]):
    """Jobs that could not be observed (job -> why), and which of them only for now (a retry may
    see them): the rest (a 403, a bug) a retry of the whole function would not fix."""

    def __init__(self) -> None:
        super().__init__()
        self.transient: set[str] = set()


class _Background:
    """A call run on a thread of its own, waited for at most so long (a thread cannot be stopped:
    one past its bound finishes unwatched, and what it found is dropped)."""

    def __init__(self, call: Callable[[], T], inline: bool = False) -> None:
        self._started = time.monotonic()
        self._done = threading.Event()
        self._box: dict[str, Any] = {}
        self._call = call if inline else None  # run by ``result``, unbounded, in the caller's thread
        if inline:
            return

        def run() -> None:
            try:
                self._box["value"] = call()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread as it is
                self._box["error"] = e
            finally:
                self._done.set()

        threading.Thread(target=run, name="respawn-list", daemon=True).start()

    def wait(self) -> T:
        """What the call returned (or raised), however long it takes."""
        if self._call is not None:
            return self._call()
        self._done.wait()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]

    def result(self, timeout: float, otherwise: Callable[[], T]) -> T:
        if self._call is not None:
            return self._call()
        if not self._done.wait(max(0.0, self._started + timeout - time.monotonic())):
            log.warning("TPU listing past its bound", extra={"json_fields": {"timeout_s": timeout}})
            return otherwise()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


def _watched(view: JobView, policy: ControllerPolicy) -> bool:
    """Whether the job's VMs are all in projects the policy watches (the aggregated list sees them):
    a job with a spec whose status records another project is listed there on its own."""
    st = view.status
    return not (view.has_spec and st is not None and st.project and st.project not in policy.watched_projects)


def _new_run(view: JobView | None) -> bool:
    """A job whose run has launched nothing yet (no status, or a status with no attempt begun), its spec
    valid or not: an invalid one's FAILED status names no TPU, yet an earlier run of the name may have
    left a TPU node or slice, which only the later listing (the recorded zones') shows."""
    return view is not None and (view.spec is not None or view.has_spec) and (
        view.status is None or view.status.attempt_started_at is None)


def _on_tpu(view: JobView) -> bool:
    """A job that runs, or ran, on a TPU node."""
    return (view.spec is not None and view.spec.tpu is not None) or (
        view.status is not None and (view.status.tpu or view.status.tpu_compute))


def _tpu_blind(view: JobView, by_api: dict[str, TpuList], unseen: tuple[str, ...],
               why: dict[str, str]) -> dict[str, Any]:
    """What a TPU job is blind to: the projects no instance list saw, and those the TPU listing of each
    API it is on (or may be: a job whose folder is gone whole says nothing of which) failed in. A
    project without the Cloud TPU API never blinds a TPU7x job there, nor Compute's refusal a Cloud TPU one."""
    spec, st = view.spec, view.status
    apis = {spec.tpu.api} if spec is not None and spec.tpu is not None else set()
    apis |= {"tpu"} if st is not None and st.tpu else set()
    apis |= {"compute"} if st is not None and st.tpu_compute else set()
    failed = {p: w for api in (apis or {"tpu", "compute"}) for p, w in by_api[api].failed_projects.items()}
    return {"unseen_projects": tuple(sorted({*unseen, *failed})),
            "unseen_why": {**{p: f"TPU nodes: {w}" for p, w in failed.items()}, **why}}


def _merged(a: TpuList, b: TpuList) -> TpuList:
    """Two listings (the Cloud TPU API's and Compute Engine's slices) as one."""
    return TpuList([*a.nodes, *b.nodes], list(dict.fromkeys([*a.unreachable, *b.unreachable])),
                   {**a.failed_projects, **b.failed_projects}, {**a.denied, **b.denied})


def _short(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def discover(store: BlobStore, checkpoint: Checkpoint) -> checkpoints.Found | None:
    """The latest complete checkpoint a spec's ``checkpoint`` names: one listing, plus trackers read."""
    bucket, prefix = checkpoints.split_uri(checkpoint.uri)

    def read(relative: str, limit: int) -> bytes | None:
        try:  # trackers are a line or two, trainer_state.json a few KiB: a huge one is not read
            return store.read(bucket, prefix + relative, limit=limit).data
        except (errors.NotFound, errors.TooLarge):
            return None

    return checkpoints.latest(checkpoint.uri, store.list(bucket, prefix), read, checkpoint.format, checkpoint.rule)
