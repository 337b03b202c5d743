"""The fleet simulator (``make sim``): respawn's real planner and executor against
baselines, over a week of simulated Spot preemptions and stockouts.

- ``sim.model``: parameters, the traces every policy shares, the ceiling (an upper bound);
- ``sim.advice``: capacity advice as Google gives it (noisy, lagging; no lifetime truth);
- ``sim.fleet``: the discrete-event world (VMs, trainers, checkpoints, zones) and the
  controllers: the real engine over the in-memory fakes, and the modelled baselines;
- ``sim.__main__``: the command line, the tables, ``results.json`` and ``results.png``.

**Sections.** The headline (``advice: "as-google-gives"``) gives every controller only what
Compute's advice gives: an obtainability score that trails the zone and is noisy, an
``estimatedUptime`` that is a noisy estimate of the zone's median lifetime, and a
``preemptionRate`` that is a fraction of stopped VMs, not a rate per day; the baselines
compute their checkpoint interval from the same estimate. ``oracle`` ("if advice were
perfect") runs respawn and the baselines again with each zone's true mean lifetime and live
stockouts. ``ceiling`` is an upper bound on any policy's expected goodput in this model, with
two oracle policies as its checks (``ideal``, ``best-zone-wait``) and a note of who exceeded
it. ``sweep`` (``--sweep``) repeats respawn against the baselines over a range of lifetime and
stockout parameters, with fewer days and seeds.

**Figures, per policy.**

- goodput: useful training over billed VM time; useful is the training in each job's newest
  complete checkpoint at the end (work since it is not counted); billed is what Google bills:
  from the insert (boot included) until the VM is STOPPED or TERMINATED, so a preempted Spot VM
  is billed through its 30 s notice to the hard-off, and one a controller deletes earlier until
  the delete;
- time_to_train_h: wall-clock hours until a job's newest complete save holds ``train_h`` of
  training (default 24 h), the mean over jobs (a job that never gets there counts the horizon,
  and the figure is marked censored);
- usd_per_job: what the job's VMs were billed until then, at the Spot price;
- training_share: useful training over the jobs' wall-clock time.

Margins are respawn minus each baseline, seed by seed (every policy meets the same draws): the
mean, the sd over seeds, in how many seeds respawn was better, and "ahead"/"behind" only where
a paired t-test over the seeds says so at 95 %, else "within noise" (no correction for the
many comparisons a table makes).

**Modelled**: Weibull Spot lifetimes per zone; stockout gaps (lognormal) between available
periods (exponential); boot; the trainer's saves (an orbax-style step directory, complete when
its marker lands), the checkpoint it resumes from, the work lost at a preemption; the 30 s
notice, a save that can still land in it, the agent's preemption marker (missed by 10 % of
VMs), the event function, the 1-minute tick; respawn's real observer, planner and executor
(placement by advice, the interval it exports); the baselines' loops.

**Not modelled**: trainer crashes and hangs (so no VM is ever billed while dead and unnoticed,
and detection speed shows in time-to-train and training share, not in billing beyond the
notice); disks and other charges billed while a VM is TERMINATED; API latency, quotas and
errors other than stockouts; a VM's lifetime depending on anything but its zone and its draw;
correlated preemptions across jobs; the real relation between Google's scores and the weather
(the advice's errors are this sim's choice: ``sim/advice.py``).
"""
