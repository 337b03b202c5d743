"""CheckpointSaver: write a save locally, upload it in the background, marker last.

The training loop pays only for the local write; one background thread uploads each save
to the checkpoint prefix (``RESPAWN_CHECKPOINT_URI``) file by file, the layout's
completion marker last, with an object ``<save>-unfinished`` beside the save from before
its first file to after its last (``respawnkit.layouts.UNFINISHED``), so respawn's finder
never resumes from a save whose upload was cut off, whatever files it holds. Saves upload
one at a time, in step order; a step already saved, waiting or uploading is not saved again.

Several ranks, each writing part of one save (a DCP save: each rank its shards, the
coordinator ``.metadata``), pass ``gather``: every rank uploads its own part, and global rank
zero uploads the files that make the save complete only once every rank's part has landed.
The ranks learn that where they already agree on saving (``should_save``), and in
``finish()`` (and ``on_step_end``'s stop), which every rank must call.

Back-pressure: at most ``max_pending`` saves (default 1) wait behind the one uploading.
A save that finds the queue full drops the *oldest waiting* save (its local copy is
removed, and stderr says so) rather than making the training loop wait: a newer complete
checkpoint supersedes it, and local disk stays bounded at ``max_pending + 1`` copies.

A preemption notice (the agent's notice file, see ``respawnkit.notice``) makes the next
``should_save`` true, once, and training goes on: a notice is not a stop. SIGTERM makes the
next ``should_save`` true, once, too. Either is skipped when the save cannot land before the
notice's deadline: the last measured write and upload times, plus what is left of an upload
under way, are compared with the time left, and a save that would not fit is skipped with a
line on stderr (a half-uploaded save is worth nothing; the upload already under way keeps the
bandwidth). After SIGTERM, ``on_step_end`` flushes until the hard-off and tells the loop to
stop. A final flush runs at exit (``atexit``), bounded by the hard-off once a notice came.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from respawnkit import dist, env, notice
from respawnkit.layouts import STEP_DIR, Layout, finder_marker, unfinished
from respawnkit.log import say
from respawnkit.progress import Progress
from respawnkit.stores import Store, open_store

# What a save is made of: a function that writes into the folder it is given (and may return a
# future, e.g. torch.distributed.checkpoint.async_save's, that the upload waits for), or an
# existing file or folder, which is copied before save() returns (hard-linked with link=True).
Source = Union[Callable[[str], Any], str, os.PathLike]
ADVICE = object()  # every_s default: respawn's advice, RESPAWN_CHECKPOINT_EVERY_S


@dataclass
class _Job:
    step: int
    name: str
    staging: str
    ready: Callable[[], Any] | None  # the local write still under way (an async save's future)
    started: float  # monotonic: when save() began
    save_s: float | None = None
    upload_started: float | None = None
    future: Any = None  # an async write's future (what ``ready`` waits on)
    last: list[str] | None = None  # with ``gather``, on rank zero: what completes the save once every part landed
    part_s: float = 0.0  # the time its own part took to upload


class CheckpointSaver:
    def __init__(self, uri: str | None = None, layout: Layout = STEP_DIR, *, every_s: Any = ADVICE,
                 every_steps: int | None = None, max_pending: int = 1, handle_sigterm: bool = True,
                 staging_dir: str | None = None, progress: Progress | None = None, store: Store | None = None,
                 sigterm: notice.Notice | None = None, agree: Callable[[Any], Any] | None = None,
                 leader: bool | None = None, gather: Callable[[Any], list[Any]] | None = None) -> None:
        uri = uri or env.checkpoint_uri()
        if store is None and not uri:
            raise ValueError("no checkpoint prefix: pass uri= or run under respawn (RESPAWN_CHECKPOINT_URI)")
        self.store = store if store is not None else open_store(str(uri))
        self.layout = layout
        self.every_s: float | None = env.number("RESPAWN_CHECKPOINT_EVERY_S") if every_s is ADVICE else every_s
        self.every_steps = every_steps
        self.max_pending = max(1, max_pending)
        self.notice = sigterm if sigterm is not None else notice.shared(install=handle_sigterm)
        self.progress = progress if progress is not None else Progress()
        self.save_s: float | None = None  # the last measured local write
        self.upload_s: float | None = None  # the last measured upload
        self.saved_step: int | None = None  # the newest step whose upload completed
        self.skipped: list[int] = []  # steps whose SIGTERM save would not have fitted the notice
        self.errors: list[str] = []
        self._errors_reported = 0  # errors a flush has returned False for already
        self._staging_root = tempfile.mkdtemp(prefix="respawnkit-", dir=staging_dir)
        self._cond = threading.Condition()
        self._pending: deque[_Job] = deque()
        self._uploading: _Job | None = None
        self._closed = False
        self._last_save = time.monotonic()
        self._notice_answered = False  # SIGTERM's save was decided
        self._warning_answered = False  # the notice file's save was decided
        # Several ranks (each with its saver): ``agree`` broadcasts global rank zero's value to every rank
        # (a save is collective: all decide alike or some wait forever); ``leader``: whether this is rank
        # zero (None: respawnkit.dist.global_rank() says). None: this process decides alone.
        self.agree = agree
        self.leader = leader
        self._agreed_stop = False
        # ``gather``: every rank's value, on every rank (torch.distributed.all_gather_object): each rank uploads its
        # part of every save, rank zero its completion files only once every part landed
        if gather is not None and (agree is None or layout.single):
            raise ValueError("gather= (each rank uploads its part of a save) needs agree= and a folder layout")
        self.gather = gather
        self._parked: dict[int, _Job] = {}  # rank zero: saves whose part landed, waiting for the other ranks'
        self._completing: deque[_Job] = deque()  # rank zero: saves every part of which landed
        self._landed: set[int] = set()  # steps whose part from this rank landed
        self._lost: set[int] = set()  # steps whose part from this rank never will: failed, or dropped
        self._worker = threading.Thread(target=self._run, name="respawnkit-upload", daemon=True)
        self._worker.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (saver := ref()) is not None and saver._at_exit())

    @property
    def stop_requested(self) -> bool:
        """SIGTERM came: the loop should stop after this step's save (``on_step_end`` says so too). With
        ``agree``, what rank zero said at the last ``should_save``: every rank stops at the same step."""
        return self._agreed_stop if self.agree is not None else self.notice.requested

    def should_save(self, step: int) -> bool:
        """Call once per finished step (on every rank, with ``agree``): reports progress, and says whether to
        save now (a preemption notice, SIGTERM, the ``every_steps`` count, or ``every_s`` seconds since the last
        save). With ``agree``, rank zero decides and every rank gets its answer (and resets its timer on a save)."""
        self.progress.step(step)
        if self.agree is None:
            save = self._wants(step)
        else:
            leads = self._leads()
            mine = (self._wants(step), self.notice.requested) if leads else (False, False)
            if self.gather is not None:  # and the oldest save rank zero waits on the others for, if any
                with self._cond:
                    mine += (min(self._parked, default=None) if leads else None,)
            save, stop, *waiting = self.agree(mine)
            save, self._agreed_stop = bool(save), bool(stop)
            if waiting and waiting[0] is not None:
                self._agree_parts(waiting[0])
        if save:
            self._last_save = time.monotonic()
        return save

    def _wants(self, step: int) -> bool:
        self.notice.poll()  # a stat: the notice file, when the agent wrote it
        if self.notice.requested:
            if self._notice_answered:
                return False
            self._notice_answered = True
            return not self._known(step) and self._fits(step)
        if self.notice.warned and not self._warning_answered:
            self._warning_answered = True
            if not self._known(step) and self._fits(step, "the notice"):
                return True
        if self.every_steps and step % self.every_steps == 0:
            return not self._known(step)
        return bool(self.every_s) and time.monotonic() - self._last_save >= self.every_s and not self._known(step)

    def on_step_end(self, step: int, source: Source) -> bool:
        """``should_save`` then ``save``; after SIGTERM, flushes and returns True: stop the loop."""
        if self.should_save(step):
            self.save(step, source)
        if not self.stop_requested:
            return False
        self._flush_everywhere(self._until_hard_off())
        self.progress.update()  # the step it stops at, for the agent's exit record (step updates are throttled)
        return True

    def save(self, step: int, source: Source, link: bool = False, began: float | None = None) -> bool:
        """Write step ``step`` locally now and queue its upload; False when that step is already saved or queued.

        ``link``: snapshot a ``source`` folder by hard links instead of copies; only for files the
        framework never rewrites in place (HuggingFace writes each save to a new folder).
        ``began``: when (``time.monotonic()``) the framework began writing a ``source`` folder it
        wrote itself: the save's time, which blocked training, is counted from there."""
        if self._known(step):
            say(f"step {step} is already saved or queued: not saving it again")
            return False
        started = time.monotonic() if began is None else min(began, time.monotonic())
        staging = tempfile.mkdtemp(prefix=f"step-{step}-", dir=self._staging_root)
        ready, future = None, None
        if callable(source):
            result = source(staging)
            if callable(getattr(result, "result", None)):
                ready, future = result.result, result
        else:
            _snapshot(os.fspath(source), staging, link)
        job = _Job(step, self.layout.name(step), staging, ready, started, future=future)
        # save_s: what blocked training (the write, or an async write's staging); the rest of an async write,
        # done in the background, counts in its upload_s
        job.save_s = self.save_s = time.monotonic() - started
        self.progress.update(save_s=round(job.save_s, 3))
        self._last_save = time.monotonic()
        with self._cond:
            while len(self._pending) >= self.max_pending:
                dropped = self._pending.popleft()
                _discard(dropped)
                self._lost.add(dropped.step)
                say(f"dropping the waiting upload of step {dropped.step}: step {step} supersedes it")
            self._pending.append(job)
            self._cond.notify_all()
        return True

    def stage_in(self, folder: str) -> None:
        """Keep local copies of later saves in a new hidden folder under ``folder`` (e.g. beside the files a
        framework writes, so that ``link=True`` links rather than copies); the old staging folder goes once empty."""
        old, self._staging_root = self._staging_root, tempfile.mkdtemp(prefix=".respawnkit-", dir=folder)
        try:
            os.rmdir(old)
        except OSError:
            pass  # a save still staged there: removed with it

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued save is uploaded (or failed); False when ``timeout`` seconds were not enough, or
        when an upload failed since the last flush (stderr names its step). With ``gather``, a save whose part
        landed here and which waits for the other ranks' is not waited for: ``finish()`` completes it."""
        end = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._pending or self._uploading or self._completing:
                if end is None and self.notice.noticed:  # a notice since: bounded by its hard-off
                    end = time.monotonic() + max(0.0, self._until_hard_off() or 0.0)
                    timeout = end - time.monotonic()
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    steps = [j.step for j in ([self._uploading] if self._uploading else []) + list(self._completing)
                             + list(self._pending)]
                    say(f"flush: step(s) {steps} still uploading after {timeout:.1f} s; the last complete save "
                        f"is step {self.saved_step}")
                    return False
                self._cond.wait(0.2 if left is None else min(left, 0.2))  # a notice may come meanwhile
            failed = self.errors[self._errors_reported:]
            self._errors_reported = len(self.errors)
        if failed:
            say(f"flush: the upload of {'; '.join(failed)} failed; the last complete save is step {self.saved_step}")
            return False
        return True

    def finish(self) -> bool:
        """The flush before a process ends: until the hard-off after a notice, else until every upload is done;
        the progress file gets the last step. With ``gather``, on every rank: the saves every part of which
        landed are completed."""
        done = self._flush_everywhere(self._until_hard_off())
        self.progress.update()
        return done

    def _flush_everywhere(self, timeout: float | None) -> bool:
        """``flush``; with ``gather``, a collective: every rank's own part, then the ranks' word on which parts
        landed, then rank zero's completion of each save every part of which did."""
        if self.gather is None:
            return self.flush(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        done = self.flush(timeout)
        self._agree_parts(None)
        done = self.flush(None if end is None else end - time.monotonic()) and done
        with self._cond:
            waiting = sorted(self._parked)
        if waiting:
            say(f"step(s) {waiting}: a part from another rank did not land: not complete, the newest complete save "
                f"is step {self.saved_step}")
        return done and not waiting

    def _leads(self) -> bool:
        return self.leader if self.leader is not None else dist.global_rank() == 0

    def _agree_parts(self, oldest: int | None) -> None:
        """Every rank says which of its parts (of saves from step ``oldest`` on) landed, and which never will; rank
        zero completes each waiting save every part of which landed, and gives up one a part of which is lost."""
        with self._cond:
            if oldest is not None:  # rank zero waits for nothing older: forget it
                self._landed = {s for s in self._landed if s >= oldest}
                self._lost = {s for s in self._lost if s >= oldest}
            mine = (sorted(self._landed), sorted(self._lost))
        reports = self.gather(mine)
        if not self._leads():
            return
        landed = set.intersection(*(set(r[0]) for r in reports))
        lost = set().union(*(set(r[1]) for r in reports))
        with self._cond:
            for step in sorted(self._parked):
                if step in landed:
                    self._completing.append(self._parked.pop(step))
                elif step in lost:
                    _discard(self._parked.pop(step))
                    say(f"step {step}: another rank's part of the save failed or was dropped: it is not completed; "
                        f"the newest complete save stays step {self.saved_step}")
            self._cond.notify_all()

    def close(self, timeout: float | None = None) -> bool:
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if done:
            self._worker.join()
            shutil.rmtree(self._staging_root, ignore_errors=True)
        return done

    def __enter__(self) -> CheckpointSaver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close(self._until_hard_off())

    def _known(self, step: int) -> bool:
        with self._cond:
            queued = [j.step for j in (*self._pending, *self._completing)] + list(self._parked) + \
                ([self._uploading.step] if self._uploading else [])
            return step == self.saved_step or step in queued

    def _until_hard_off(self) -> float | None:
        self.notice.poll()
        return self.notice.until_hard_off()

    def _fits(self, step: int, why: str = "SIGTERM") -> bool:
        left = self.notice.left() or 0.0
        if self.save_s is None or self.upload_s is None:
            say(f"{why} save at step {step}: no save measured yet to tell whether it fits {left:.1f} s: trying")
            return True
        with self._cond:
            job = self._uploading
            ahead = max(0.0, self.upload_s - (time.monotonic() - job.upload_started)) \
                if job and job.upload_started else (self.upload_s if job else 0.0)
        need = self.save_s + self.upload_s + ahead
        if need <= left:
            return True
        self.skipped.append(step)
        under_way = f" + {ahead:.1f} s for the upload under way" if ahead else ""
        say(f"{why} at step {step}: not saving: a save needs about {need:.1f} s (write {self.save_s:.1f} s + "
            f"upload {self.upload_s:.1f} s{under_way}) and {left:.1f} s are left before the deadline; "
            f"the newest complete save stays step {self.saved_step}")
        return False

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._completing and not self._closed:
                    self._cond.wait()
                completing = bool(self._completing)
                if not completing and not self._pending:
                    return
                job = self._uploading = self._completing.popleft() if completing else self._pending.popleft()
            parked = False
            try:
                if completing:
                    self._complete(job)
                else:
                    parked = self._upload(job)
            except Exception as e:  # one failed upload leaves the previous save; the next one may land
                self.errors.append(f"step {job.step}: {e}")
                with self._cond:
                    self._lost.add(job.step)
                say(f"the upload of step {job.step} failed ({type(e).__name__}: {e}); the newest complete save "
                    f"stays step {self.saved_step}")
            finally:
                with self._cond:
                    if parked:  # kept, its completion files with it, until every rank's part landed
                        self._parked[job.step] = job
                    self._uploading = None
                    self._cond.notify_all()
                if not parked:
                    shutil.rmtree(job.staging, ignore_errors=True)

    def _upload(self, job: _Job) -> bool:
        """Upload ``job``'s save (with ``gather``: this rank's part of it); True when its completion waits for the
        other ranks' parts."""
        job.upload_started = time.monotonic()
        if job.ready is not None:
            job.ready()  # the background write's remainder: part of upload_s, never of save_s
        files = _files(job.staging)
        if self.layout.single:
            if len(files) != 1:
                raise ValueError(f"layout {self.layout.pattern!r} is one object, but the save holds {len(files)} files")
            self.store.put(os.path.join(job.staging, files[0]), job.name)
            self._saved(job)
            return False
        marker = str(self.layout.marker)
        if self.gather is not None and not self._leads():
            self._upload_part(job, files, marker)
            return False
        if marker in files:
            files.remove(marker)
        elif self.layout.marker_from_writer:
            raise ValueError(f"the save has no {marker}: it is not complete")
        else:
            os.makedirs(os.path.dirname(os.path.join(job.staging, marker)), exist_ok=True)
            open(os.path.join(job.staging, marker), "wb").close()
        # hidden from the finder from before the first file to after the last; the files it takes as markers last
        # even so, the layout's own the very last (a custom rule reads that one alone)
        flag = os.path.join(job.staging, ".respawnkit-unfinished")
        open(flag, "wb").close()
        self.store.put(flag, unfinished(job.name))
        job.last = [f for f in files if finder_marker(f)] + [marker]
        for name in [f for f in files if not finder_marker(f)]:
            self.store.put(os.path.join(job.staging, *name.split("/")), f"{job.name}/{name}")
            if self.gather is not None:  # kept while the others' parts land: only what completes it
                os.remove(os.path.join(job.staging, *name.split("/")))
        if self.gather is None:
            self._complete(job)
            return False
        job.part_s = time.monotonic() - job.upload_started
        with self._cond:
            self._landed.add(job.step)
        return True

    def _upload_part(self, job: _Job, files: list[str], marker: str) -> None:
        """Another rank's part of a save: its files, none of which may complete the save (rank zero's do, once
        every part landed)."""
        completing = [f for f in files if f == marker or finder_marker(f) or f.split("/")[0] == "random_states_0.pkl"]
        if completing:
            raise ValueError(f"this rank's part of the save holds {completing}, which respawn's finder may take as "
                             f"the save complete: only global rank zero's part may hold them")
        for name in files:
            self.store.put(os.path.join(job.staging, *name.split("/")), f"{job.name}/{name}")
        with self._cond:
            self._landed.add(job.step)
        say(f"step {job.step}: this rank's part uploaded to {job.name} ({time.monotonic() - job.upload_started:.2f} s)")

    def _complete(self, job: _Job) -> None:
        """The files that make ``job``'s save complete, its layout's marker last; then it is shown to the finder."""
        started = time.monotonic()
        for name in job.last or []:
            self.store.put(os.path.join(job.staging, *name.split("/")), f"{job.name}/{name}")
        self.store.delete(unfinished(job.name))
        if self.gather is not None:  # its upload time: its part's, and this
            job.upload_started = started - job.part_s
        self._saved(job)

    def _saved(self, job: _Job) -> None:
        assert job.upload_started is not None
        self.upload_s = time.monotonic() - job.upload_started
        self.saved_step = job.step if self.saved_step is None else max(self.saved_step, job.step)
        self.progress.update(upload_s=round(self.upload_s, 3), saved_step=self.saved_step)
        say(f"step {job.step} saved as {job.name} (write {job.save_s or 0:.2f} s, upload {self.upload_s:.2f} s)")

    def _at_exit(self) -> None:
        with self._cond:
            idle = not self._pending and not self._uploading and not self._completing
        if not idle:
            self.flush(self._until_hard_off())  # no notice: until done, unless a SIGTERM comes meanwhile
        with self._cond:
            waiting = sorted(self._parked)
        if waiting:  # no collective at exit: the other ranks may be gone
            say(f"step(s) {waiting}: not completed, the other ranks' parts not known to have landed (call finish() "
                f"on every rank before the end)")
        self.progress.update()  # the last step reached (step updates are throttled)


def _discard(job: _Job) -> None:
    """Remove a dropped save's local copy: once its write is over, when it is still being written (an async save
    writing into a folder removed under it fails, and leaves files behind)."""
    def remove(*_: object) -> None:
        shutil.rmtree(job.staging, ignore_errors=True)

    if job.ready is None:
        remove()
    elif callable(getattr(job.future, "add_done_callback", None)):
        job.future.add_done_callback(remove)
    else:  # a waitable with no callbacks (Orbax's): waited on aside
        def wait() -> None:
            try:
                job.ready()
            except Exception:
                pass
            remove()
        threading.Thread(target=wait, name="respawnkit-discard", daemon=True).start()


def _files(folder: str) -> list[str]:
    found = []
    for where, _, leaves in os.walk(folder):
        found += [os.path.relpath(os.path.join(where, leaf), folder).replace(os.sep, "/") for leaf in leaves]
    return sorted(found)


def _snapshot(source: str, staging: str, link: bool) -> None:
    """The save as it is now, immune to the framework deleting or rotating the original while it uploads:
    copies, or hard links (instant; the same bytes if the original is rewritten in place)."""
    copy = _link if link else shutil.copy2
    if os.path.isfile(source):
        copy(source, os.path.join(staging, os.path.basename(source)))
        return
    if not os.path.isdir(source):
        raise FileNotFoundError(f"nothing to save at {source}")
    for where, _, leaves in os.walk(source):
        for leaf in leaves:
            target = os.path.join(staging, os.path.relpath(os.path.join(where, leaf), source))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            copy(os.path.join(where, leaf), target)


def _link(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
