"""What ``respawn canary`` does last, whatever happened before (an error, Ctrl-C): nothing of its
own left behind. Its jobs are cancelled, so that the controller deletes their VMs and ends them
as it would anyone's; any VM of theirs still there after a while is deleted here; then the jobs
are removed (``respawn rm``'s way: spec first, status last). Signals are ignored meanwhile: the
Ctrl-C that stopped the measuring began this, and a second one must not cut it short.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from controller.core import errors, names
from controller.service import jobruns
from controller.service.jobs import Jobs, Refused

LIST_EVERY_S = 2.0


class Cleanup:
    def __init__(self, project: str, zones: Sequence[str], jobs: Jobs, compute: Any,
                 say: Callable[[str], None]) -> None:
        """``compute``: the CLI's Compute gateway (``list_managed``, ``delete``)."""
        self.project, self.zones, self.jobs, self.compute, self.say = project, tuple(zones), jobs, compute, say

    def run(self, submitted: Sequence[str], bound: float) -> list[str]:
        """Cancel each job, wait (half of ``bound`` s at most) for the controller to end them and
        delete their VMs, delete those still there, then remove the jobs. What is left (a job the
        controller never ended, a VM that would not go), each in words with what to do; [] when
        nothing."""
        if not submitted:
            return []
        with _shielded():
            return self._run(list(submitted), bound)

    def _run(self, submitted: list[str], bound: float) -> list[str]:
        deadline = time.monotonic() + bound
        self.say(f"cleaning up {_jobs(len(submitted))} (Ctrl-C ignored until done, {bound:g} s at most)")
        for job in submitted:
            try:
                self.jobs.cancel(job)
            except (Refused, errors.RespawnError) as e:
                self.say(f"{job}: cancel not written: {e}")
        ended, vms = self._settle(submitted, deadline - bound / 2)
        for vm in vms:  # the controller did not delete them in time: this command does
            try:
                self.compute.delete(vm.project, vm.zone, vm.name)
                self.say(f"deleted {vm.name} in {vm.zone} (the controller had not)")
            except errors.NotFound:
                pass
            except errors.RespawnError as e:
                self.say(f"{vm.name}: delete refused: {e}")
        if vms:
            ended, vms = self._settle(submitted, deadline)
        left = [f"VM {vm.name} in {vm.zone} (gcloud compute instances delete {vm.name} --zone {vm.zone} "
                f"--project {vm.project})" for vm in vms]
        for job in submitted:
            try:
                if job in ended:
                    jobruns.remove(self.jobs, job)
                elif self.jobs.status(job) is None and self._forget_untaken(job):
                    self.say(f"{job}: never taken up by the controller: its spec and cancel deleted")
                else:
                    left.append(f"job {job} (not ended by the controller: respawn cancel {job}, then respawn rm {job})")
            except (Refused, errors.RespawnError) as e:
                left.append(f"job {job} ({e})")
        return left

    def _settle(self, submitted: list[str], until: float) -> tuple[set[str], list[Any]]:
        """Until ``until`` (time.monotonic()), or until every job has ended and no VM of theirs is
        listed: the jobs ended, and their VMs as last listed."""
        ours, vms = set(submitted), []
        while True:
            ended = {job for job in submitted if self._ended(job)}
            try:
                listed = self.compute.list_managed([self.project], zones=self.zones)
                vms, complete = [i for i in listed.instances if i.job in ours], not listed.unreachable
            except errors.RespawnError as e:
                self.say(f"the VMs could not be listed: {e} (trying again)")
                complete = False
            if (ended == ours and complete and not vms) or time.monotonic() >= until:
                return ended, vms
            time.sleep(LIST_EVERY_S)

    def _ended(self, job: str) -> bool:
        """Its run is over (terminal), or nothing of it is left at all."""
        try:
            st = self.jobs.status(job)
            return st.phase.terminal if st is not None else not self.jobs.rows(job)
        except errors.RespawnError:
            return False

    def _forget_untaken(self, job: str) -> bool:
        """A job the controller never took up (no status: nothing of it runs): its objects deleted,
        each by generation, so that one written meanwhile (the controller taking it up) stays."""
        for info in self.jobs.store.list(self.jobs.bucket, f"{names.JOBS_PREFIX}{job}/"):
            try:
                self.jobs.store.delete(self.jobs.bucket, info.name, if_generation_match=info.generation)
            except errors.NotFound:
                continue
            except errors.PreconditionFailed:
                return False
        return self.jobs.status(job) is None and not self.jobs.rows(job)


def _jobs(count: int) -> str:
    return "1 canary job" if count == 1 else f"{count} canary jobs"


@contextmanager
def _shielded() -> Iterator[None]:
    """Ctrl-C, SIGTERM and a closed terminal ignored (main thread only: where signals land)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
