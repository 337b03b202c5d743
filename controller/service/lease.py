"""One pass over every job at a time: a lease in the control bucket, taken by a conditional write.

A pass over every job pays the whole fleet's requests. Two of them side by side are safe (every
job's status is a compare-and-swap) but each pays it all again, and a tick slow enough to outlive
its minute then makes the next one slower still. Nothing else keeps them apart: Cloud Scheduler
never overlaps the runs of one job, but a pass goes on past its attempt's deadline; a hint's pass
over every job (``on_audit`` for a TPU worker) and ``respawn reconcile`` start beside a tick; any
function instance may take any of them.

The lease is one small object, ``respawn/lease/tick``, under the controller's own prefix (the
trainers' IAM condition admits only VM records under ``jobs/`` and ``preempted-jobs/``: no trainer
can take it, hold it or release it). A pass over every job takes it before it observes:

- **take**: a create (``ifGenerationMatch=0``: the last pass released it, so one request in the
  usual case), or, over a lease that has lapsed, a write conditioned on the generation read. Either
  answering 412 is read back first: google-cloud-storage retries conditional uploads, so a write
  whose first try landed can answer 412 on its retry; the body names the pass and its renewal, so
  our own bytes there mean it was ours all along.
- **lapsed**: by GCS's clock, never the holder's: the object's ``updated`` time plus the holder's
  own ttl, and then ``margin`` more. Two function instances' clocks may disagree; each judges
  GCS's timestamp against its own clock, so only one skew (this instance against GCS) counts, and
  the margin covers it. One that finds it lapsed by its own clock asks GCS's before it takes it
  over (``gcs_now``: the updated time of a write of ``respawn/lease/tick.clock``): a clock ahead by
  more than the margin (a laptop running ``respawn reconcile``) took a lease its holder still acted under.
- **held**: renewed every ``renew`` seconds on a thread of its own, so a pass slow to observe (a
  first tick over 10,000 jobs reads for a minute before it acts) keeps it. The holder acts only
  while ``monotonic() < sent + ttl - margin``, ``sent`` being when it sent its last write that
  landed: before GCS stamped ``updated``, so the holder stops before the lease lapses by GCS's
  clock whatever its own wall clock says, and a renewal that fails (or a renewing thread starved
  of CPU) ends its acting on time. It never acts past ``max_hold`` from its take (the function's
  timeout: a pass stalled in a request keeps renewing until then at most, then stops acting and
  lets the lease lapse).
- **released** at the end by a delete conditioned on its generation: one that lapsed and was
  taken is the next holder's, never deleted.

GCS allows about one write a second to one object: a pass writes the lease once at its take and
once every ``renew`` seconds (10 by default).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType

from controller.core import errors
from controller.core.clock import Clock
from controller.core.ports import Blob, BlobStore

log = logging.getLogger(__name__)
KEY = "respawn/lease/tick"
MAX_BYTES = 4096  # a lease's body is a few hundred bytes: anything larger is none of ours
MAX_TTL = 600.0  # the longest ttl a lease's body is believed for (anyone who may write the bucket can write one)
TAKES = 3  # conditional writes one take tries before it says the lease is contended


@dataclass(frozen=True)
class Terms:
    """The lease's durations, in seconds (``Settings.lease_terms``: RESPAWN_LEASE_*)."""

    ttl: float = 30.0  # a lease lasts this long past its last write (GCS's updated)
    renew: float = 10.0  # the holder writes it again this often
    margin: float = 5.0  # the holder stops acting this long before its lease lapses; a taker waits this long after
    max_hold: float = 540.0  # no pass acts longer than this from its take (the functions' timeout)

    def __post_init__(self) -> None:
        if not 0 < self.renew < self.ttl - self.margin or self.margin < 0 or self.max_hold <= 0:
            raise ValueError(f"lease terms need 0 < renew < ttl - margin and margin >= 0: {self}")


@dataclass(frozen=True)
class Busy:
    """The lease is another pass's: this one does nothing."""

    holder: str
    until: datetime  # when it lapses by GCS's clock (its updated + the holder's ttl)

    def describe(self) -> str:
        return f"another pass holds the lease until {self.until.isoformat(timespec='seconds')} ({self.holder})"


class Leases:
    """Takes the lease for one pass at a time; one for each engine (its store, bucket and clock)."""

    def __init__(self, store: BlobStore, bucket: str, clock: Clock, terms: Terms | None = None, key: str = KEY,
                 monotonic: Callable[[], float] = time.monotonic, holder: str | None = None) -> None:
        self.store, self.bucket, self.clock, self.key = store, bucket, clock, key
        self.terms = terms or Terms()
        self.monotonic = monotonic  # the holder's deadlines; a FakeClock's in tests
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"  # who, for people reading a Busy

    def keyed(self, key: str) -> Leases:
        """The same terms and holder for another lease object (a shard's)."""
        return Leases(self.store, self.bucket, self.clock, self.terms, key, self.monotonic, self.holder)

    def take(self) -> Held | Busy:
        """The lease for a new pass, or who holds it. Raises only what the store raised on a read."""
        pass_id = uuid.uuid4().hex
        expected, current = 0, None
        for _ in range(TAKES):
            body, sent = self.body(pass_id, 0), self.monotonic()
            try:
                info = self.store.write(self.bucket, self.key, body, if_generation_match=expected)
                return Held(self, pass_id, info.generation, sent)
            except errors.PreconditionFailed:
                pass
            current = self.read()
            if current is None:  # released between our write and our read
                expected = 0
                continue
            if current.data == body:  # a retry's 412 after its first try landed: ours
                return Held(self, pass_id, current.info.generation, sent)
            # GCS's updated against this instance's clock, never the holder's "at": two instances'
            # clocks may disagree, and only this one's skew against GCS is then left for the margin.
            due = self.lapses(current) + timedelta(seconds=self.terms.margin)
            if self.clock.now() < due:
                return self.busy(current)
            # Lapsed by this machine's clock, which may run ahead of GCS's by more than the margin (a
            # laptop running respawn reconcile): judged again by GCS's own clock, the updated time it
            # gives a write of ours, before it is taken from a holder that may still be acting.
            try:
                if self.gcs_now() < due:
                    return self.busy(current)
            except errors.TransientError as e:  # two takers at once (GCS's one write a second): the next tick
                log.warning("could not read GCS's time to judge a lapsed lease: %s", e)
                return self.busy(current)
            expected = current.info.generation  # lapsed: its holder crashed or stalled; taken over
            log.warning("taking over a lapsed lease of %s", self.busy(current).holder,
                        extra={"json_fields": {"lease": self.key, "generation": expected}})
        if current is None:
            raise errors.TransientError(f"gs://{self.bucket}/{self.key}: created and gone {TAKES} times in a row")
        return self.busy(current)

    def gcs_now(self) -> datetime:
        """GCS's time now: the updated time of a write of ours (``<key>.clock``, a few bytes;
        written only when a lease looks lapsed, so seldom). A write that fails raises."""
        return self.store.write(self.bucket, f"{self.key}.clock", self.holder.encode()[:200]).updated

    def body(self, pass_id: str, renewal: int) -> bytes:
        """Unique to the pass and its renewal, so that reading it back says whose write landed."""
        return json.dumps({"holder": self.holder, "pass": pass_id, "renewal": renewal, "ttl_s": self.terms.ttl,
                           "at": self.clock.now().isoformat()}).encode()

    def read(self) -> Blob | None:
        try:
            return self.store.read(self.bucket, self.key, limit=MAX_BYTES)
        except errors.NotFound:
            return None
        except errors.TooLarge:  # none of ours: judged as one without a body (stat: its updated alone)
            return Blob(self.store.stat(self.bucket, self.key), b"")

    def lapses(self, lease: Blob) -> datetime:
        """When ``lease`` lapses by GCS's clock: its updated time plus the ttl its holder wrote
        (a holder deployed with other terms is judged by its own), or ours for a body we cannot read."""
        ttl = self.terms.ttl
        try:
            written = float(json.loads(lease.data)["ttl_s"])
            # NaN (JSON's NaN, or "nan") passes min and max through, and timedelta refuses it: every
            # take would raise for as long as such an object lay there. Not a number: ours.
            if not math.isnan(written):
                ttl = min(max(written, 0.0), MAX_TTL)
        except (ValueError, TypeError, KeyError, RecursionError):
            pass
        return lease.info.updated + timedelta(seconds=ttl)

    def busy(self, lease: Blob) -> Busy:
        try:
            holder = str(json.loads(lease.data)["holder"])[:200]
        except (ValueError, TypeError, KeyError, RecursionError):
            holder = "unreadable lease"
        return Busy(holder, self.lapses(lease))


class Held:
    """A pass's lease: renewed on its own thread while the pass runs (``with``), released at the end.

    ``acting()`` is the one question the pass asks before each action (controller.service.executor):
    any thread may ask it at any time, without a request."""

    def __init__(self, leases: Leases, pass_id: str, generation: int, sent: float) -> None:
        self.leases, self.pass_id = leases, pass_id
        self.terms = leases.terms
        self._generation, self._sent, self._renewal = generation, sent, 0
        self._taken = sent
        self._lost: str | None = None
        self._lock = threading.Lock()  # one renewal or release at a time
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def acting(self) -> bool:
        """Whether this pass may still act: its lease not lost, not lapsing within the margin, and
        the pass within its longest hold (all by its own monotonic clock)."""
        return self.why_not() is None

    def why_not(self) -> str | None:
        """None while the pass may act; otherwise why not, for its summary and log."""
        if self._lost:
            return self._lost
        now, t = self.leases.monotonic(), self.terms
        if now >= self._taken + t.max_hold - t.margin:
            return f"the pass outlived its longest hold ({t.max_hold:g} s)"
        if now >= self._sent + t.ttl - t.margin:
            return f"its lease was not renewed for {now - self._sent:.0f} s (ttl {t.ttl:g} s): another pass may hold it"
        return None

    def renew(self) -> bool:
        """Write the lease again on its generation; False when it was not (the deadline of the last
        write that landed stands: ``acting`` says when it passes)."""
        with self._lock:
            if self._lost or self.leases.monotonic() >= self._taken + self.terms.max_hold:
                return False  # taken by another, released, or held as long as a pass may: left to lapse
            leases, renewal = self.leases, self._renewal + 1
            body, sent = leases.body(self.pass_id, renewal), leases.monotonic()
            try:
                info = leases.store.write(leases.bucket, leases.key, body, if_generation_match=self._generation)
            except errors.PreconditionFailed:
                try:
                    current = leases.read()
                except errors.RespawnError as e:
                    log.warning("could not read the lease back after a 412: %s", e)
                    return False
                if current is None or current.data != body:
                    self._lost = (f"another pass took the lease ({leases.busy(current).holder})" if current
                                  else "its lease was deleted by another writer")
                    log.warning("this pass lost its lease: %s", self._lost, extra={"json_fields": {"lease": leases.key}})
                    return False
                info = current.info  # a retry's 412 after its first try landed
            except errors.RespawnError as e:
                log.warning("could not renew the lease: %s: %s", type(e).__name__, e)
                return False
            self._generation, self._sent, self._renewal = info.generation, sent, renewal
            return True

    def release(self) -> None:
        """Stop renewing; delete the lease on its generation (one taken meanwhile is not ours)."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        with self._lock:
            if self._lost:
                return
            self._lost = "released"
            leases = self.leases
            try:
                leases.store.delete(leases.bucket, leases.key, if_generation_match=self._generation)
            except (errors.NotFound, errors.PreconditionFailed):
                pass  # lapsed, and deleted or taken since: the next holder's
            except errors.RespawnError as e:  # it lapses by itself within its ttl
                log.warning("could not release the lease: %s: %s", type(e).__name__, e)

    def _renewing(self) -> None:
        while not self._done.wait(self.terms.renew):
            try:
                renewed = self.renew()
            except Exception:  # noqa: BLE001 - what no adapter translated (an auth refresh's TransportError)
                # Ending the thread here ended every later renewal: the pass stopped acting within
                # the ttl though the next write would have landed. The deadline stands meanwhile.
                log.exception("could not renew the lease")
                renewed = False
            if not renewed and (self._lost or self.leases.monotonic() >= self._taken + self.terms.max_hold):
                return

    def __enter__(self) -> Held:
        self._thread = threading.Thread(target=self._renewing, name="respawn-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
