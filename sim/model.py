"""The simulated world's parameters, its traces, and the goodput ceiling.

A **trace** is everything random about a week of the fleet, drawn once per seed and shared
by every policy, so that policies are compared on the same weather:

- per zone: the median Spot lifetime (Weibull, shape ``k``), and the zone's stockout
  timeline: available periods (exponential) alternating with stockout gaps (lognormal,
  fitted to a median and a 90th percentile);
- per job: the order of its zones, and one stream of draws per VM (common random numbers):
  the job's *i*-th VM gets the same uniform for its lifetime, the same boot time and the same
  "missed the notice" coin under every policy; its lifetime is that uniform through the
  Weibull of the zone the policy put it in, so a policy that picks a better zone gets a
  longer life from the same draw.

**Paid time** is what Google bills: a VM is billed from its insert (boot included) until it is
STOPPED or TERMINATED. A preempted Spot VM is billed through its notice, to the hard-off
(``L + notice``), whatever the controller does meanwhile; a VM a controller deletes before any
notice is billed until the delete. (The sim models no crash or hang, so no VM bills while
nobody notices it is dead: see ``sim/__init__.py``.)

**The ceiling** (``ceiling``) is an upper bound on the expected goodput of *any* policy in this
model. A job's goodput is the useful training its VMs commit over what they are billed, a
ratio of sums over its VMs; each VM's lives are independent of what came before, so no
policy can expect more than the best zone's best ratio. For one zone with lifetime ``L``
(creation to the notice; survival ``S(t) = exp(-(t/λ)^k)``), boot ``b`` and checkpoint cost
``C``, a save that completes at age ``t`` counts when ``L ≥ t - (notice - margin)``; the
trainer may save at *any* ages it likes (not only on a fixed interval: Weibull k < 1 makes
older VMs safer, so the best schedule stretches with age). The best expected useful time
from age ``t``, ``V(t) = max(0, max_{t' ≥ t + C} (t' - t - C) S(t' - slack) + V(t'))``, is
solved by dynamic programming on a grid of ages (steps of 5 s, growing 0.2 % per step), and::

    G_z* = E_b[V(b)] / (E[L_z] + notice),   E[L_z] = λ_z Γ(1 + 1/k);   ceiling = max_z G_z*

A policy that waits is not charged for waiting (goodput is a ratio), so a policy that runs
only in the best zone and waits out its stockouts approaches this bound; recovering at once
in a worse zone lowers the ratio. The bound is on expectations: a finite week's measured ratio
may exceed it by noise, which the results flag (``exceeded_by``).

Beside it, ``reference_ideal``: the expected goodput of the ``ideal`` policy (at every loss, a
new VM at once in the best zone available, on that zone's optimal *fixed* interval): the
zones' ``G_z(τ_z*)`` weighted by the share of paid time each is the best one available. It is a
reference, not a bound (the best-zone-and-wait policy exceeds it). The first-order Young/Daly
approximation ``(τ / (τ + C)) · (1 - (b + (τ + C)/2) / M)``, ``τ = √(2CM)``, is reported too.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

Z90 = 1.2815515655446004  # the standard normal's 90th percentile
ZONE_NAMES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-east1-b", "us-east1-c")


@dataclass(frozen=True)
class Params:
    """Everything the command line can set; the defaults are ``make sim``'s."""

    days: float = 7.0
    jobs: int = 8
    zones: int = 3
    seed: int = 1
    seeds: int = 6  # independent weeks: seed, seed+1, ...; figures are their means (percentiles pooled)
    # Spot lifetimes: Weibull, shape k, median drawn per zone in this range (hours).
    weibull_k: float = 0.8
    lifetime_median_h: tuple[float, float] = (0.5, 1.1)
    # Stockout gaps: lognormal per zone, median and 90th percentile drawn in these ranges (hours).
    stockout_median_h: tuple[float, float] = (0.4, 0.75)
    stockout_p90_h: tuple[float, float] = (2.0, 4.0)
    # Available periods between gaps: exponential with this mean (hours). The sim's own choice.
    available_mean_h: float = 6.0
    boot_s: tuple[float, float] = (120.0, 180.0)
    checkpoint_cost_s: float = 120.0
    notice_s: float = 30.0
    notice_miss: float = 0.1  # probability that a VM misses the notice: no marker
    marker_margin_s: float = 5.0  # the agent writes the marker at the latest this long before the hard-off
    # The marker written -> the event function's pass: drawn per event from a lognormal through the
    # bench's measured p50 and p99 of the same path, from the preemption notice to the event
    # function running (bench/results.json event_from_notice_p50_s / _p99_s: the VM agent's marker,
    # Eventarc, a cold start where there was one), charged on top of the sim's own marker timing.
    event_delay_p50_s: float = 6.1
    event_delay_p99_s: float = 24.6
    tick_s: float = 60.0
    poll_s: float = 15.0  # the managed-jobs loop's poll
    # ... and its wait before relaunching: none, as SkyPilot's managed jobs recover (its
    # RETRY_INIT_GAP_SECONDS, 60 s, is the backoff after a launch that failed: retry_s here).
    poll_wait_s: float = 0.0
    retry_s: float = 60.0  # a baseline's retry after every zone it tried was out of capacity
    mig_check_s: float = 60.0  # how often the MIG-like baseline notices a stopped VM
    # SkyPilot's managed-jobs controller as its code has it (sky/jobs/controller.py,
    # recovery_strategy.py; see sim/fleet.py SkyPilot): a check every 15 s
    # (JOB_STATUS_CHECK_GAP_SECONDS), the job's status fetched from the cluster with a 30 s cap
    # (_JOB_STATUS_FETCH_TIMEOUT_SECONDS), relaunch gaps from 60 s (RETRY_INIT_GAP_SECONDS) x1.6 up
    # to 300 s, +-40 % jitter. ``skypilot_launch_s``: its launch path beyond the VM's boot (SSH
    # readiness, runtime and Ray start, job submission and its 5 s start poll): the sim's choice,
    # the code has no fixed figure for it.
    skypilot_poll_s: float = 15.0
    skypilot_fetch_timeout_s: float = 30.0
    skypilot_retry_s: float = 60.0
    skypilot_launch_s: float = 30.0
    fixed_interval_s: float = 1800.0
    keep_checkpoints: int = 3
    price_gpu_h: float = 1.47  # US$ per GPU-hour, Spot
    gpus_per_vm: int = 1
    policies: tuple[str, ...] = ()  # empty: the section's own
    # What capacity advice tells the controllers (sim/advice.py):
    # "as-google-gives" (the headline): obtainability a noisy, lagging score; estimatedUptime a
    #   noisy estimate of the zone's *median* lifetime; preemptionRate a fraction 0..1 that says
    #   nothing of how soon; no lifetime truth anywhere;
    # "oracle": each zone's true mean lifetime and live stockouts ("if advice were perfect");
    # "obtainability": live stockouts only (perfect), no Spot uptime or rate.
    advice: str = "as-google-gives"
    advice_uptime_sigma: float = 0.3  # estimatedUptime = true median x lognormal(0, sigma) ...
    advice_uptime_refresh_h: float = 24.0  # ... the factor redrawn per zone this often
    advice_obtainability_sd: float = 0.15  # normal noise on the score, then rounded to 0.1
    advice_obtainability_lag_s: float = 600.0  # the score reflects the zone's capacity this long ago
    advice_rate_range: tuple[float, float] = (0.6, 1.0)  # preemptionRate per zone and day, unrelated to lifetime
    # A fixed amount of training per job: time_to_train_h and usd_per_job are for this much.
    train_h: float = 24.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0


@dataclass(frozen=True)
class Zone:
    name: str
    lifetime_median_s: float
    scale_s: float  # Weibull λ
    mean_s: float  # E[L]
    stockout_median_s: float
    stockout_p90_s: float
    stockouts: tuple[tuple[float, float], ...]  # [start, end) seconds from the start

    @classmethod
    def weibull(cls, name: str, median_s: float, k: float, stockout_median_s: float = 0.0,
                stockout_p90_s: float = 0.0, stockouts: tuple[tuple[float, float], ...] = ()) -> Zone:
        """A zone whose Spot lifetimes are Weibull of shape ``k`` with median ``median_s``."""
        scale = median_s / math.log(2) ** (1 / k)
        return cls(name, median_s, scale, scale * math.gamma(1 + 1 / k), stockout_median_s, stockout_p90_s, stockouts)

    def lifetime(self, u: float, k: float) -> float:
        """The Weibull lifetime whose survival is ``u`` (inverse transform)."""
        return self.scale_s * (-math.log(u)) ** (1.0 / k)

    def out_at(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.stockouts)

    def out_fraction(self, horizon: float) -> float:
        return sum(min(b, horizon) - a for a, b in self.stockouts if a < horizon) / horizon


@dataclass
class VmDraw:
    u: float  # survival of the lifetime
    boot_s: float
    misses_notice: bool


@dataclass
class JobTrace:
    name: str
    zones: tuple[str, ...]  # the spec's order (the MIG-like baseline's zone is the first)
    seed: str
    _drawn: list[VmDraw] = field(default_factory=list)
    _rng: random.Random | None = None

    def vm(self, index: int, p: Params) -> VmDraw:
        """The ``index``-th VM's draws (0-based), the same under every policy."""
        if self._rng is None:
            self._rng = random.Random(self.seed)
        while len(self._drawn) <= index:
            r = self._rng
            u = 1.0 - r.random()  # (0, 1]
            self._drawn.append(VmDraw(u, r.uniform(*p.boot_s), r.random() < p.notice_miss))
        return self._drawn[index]


@dataclass
class Trace:
    params: Params
    zones: dict[str, Zone]
    jobs: dict[str, JobTrace]

    @property
    def mean_lifetime_s(self) -> float:
        """M as a user would compute it from the zones' figures: the zones' mean lifetime."""
        return sum(z.mean_s for z in self.zones.values()) / len(self.zones)


def make_trace(p: Params) -> Trace:
    rng = random.Random(f"trace-{p.seed}")
    k = p.weibull_k
    zones: dict[str, Zone] = {}
    for name in ZONE_NAMES[: p.zones]:
        median = rng.uniform(*p.lifetime_median_h) * 3600
        g_med = rng.uniform(*p.stockout_median_h) * 3600
        g_p90 = rng.uniform(*p.stockout_p90_h) * 3600
        mu, sigma = math.log(g_med), math.log(g_p90 / g_med) / Z90
        avail_mean = p.available_mean_h * 3600
        gap_mean = math.exp(mu + sigma * sigma / 2)
        t, gaps = 0.0, []
        out = rng.random() < gap_mean / (gap_mean + avail_mean)  # start in the stationary mix
        while t < p.horizon_s:
            if out:
                end = t + rng.lognormvariate(mu, sigma)
                gaps.append((t, end))
                t = end
            else:
                t += rng.expovariate(1 / avail_mean)
            out = not out
        zones[name] = Zone.weibull(name, median, k, g_med, g_p90, tuple(gaps))
    names_ = list(zones)
    jobs = {}
    for i in range(p.jobs):
        job = f"job{i}"
        jobs[job] = JobTrace(job, tuple(rng.sample(names_, len(names_))), f"vms-{p.seed}-{job}")
    return Trace(p, zones, jobs)


# -- the ceiling ---------------------------------------------------------------------------------

def _boot_points(p: Params, n: int = 9) -> list[float]:
    lo, hi = p.boot_s
    return [lo + (hi - lo) * (i + 0.5) / n for i in range(n)] if hi > lo else [lo]


def paid_per_life(z: Zone, p: Params) -> float:
    """E[billed seconds] of one VM in zone ``z`` that lives to its preemption: through the notice."""
    return z.mean_s + p.notice_s


def zone_goodput(z: Zone, tau: float, p: Params) -> float:
    """G_z(τ): committed training per billed second in zone ``z``, saving every ``τ`` of training."""
    k, lam = p.weibull_k, z.scale_s
    slack = p.notice_s - p.marker_margin_s
    boots = _boot_points(p)
    useful = 0.0
    for b in boots:
        i = 1
        while True:
            t = b + i * (tau + p.checkpoint_cost_s) - slack
            s = 1.0 if t <= 0 else math.exp(-((t / lam) ** k))
            useful += s
            if s < 1e-12:
                break
            i += 1
    return tau * useful / len(boots) / paid_per_life(z, p)


def best_interval(z: Zone, p: Params) -> tuple[float, float]:
    """(τ*, G_z(τ*)) by a coarse grid, then golden-section search around its best point."""
    grid = [60.0 * 1.15**i for i in range(60)]  # 60 s .. ~1 week
    values = [zone_goodput(z, t, p) for t in grid]
    at = max(range(len(grid)), key=values.__getitem__)
    lo, hi = grid[max(0, at - 1)], grid[min(len(grid) - 1, at + 1)]
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if zone_goodput(z, a, p) >= zone_goodput(z, b, p):
            hi = b
        else:
            lo = a
    tau = (lo + hi) / 2
    return tau, zone_goodput(z, tau, p)


def zone_bound(z: Zone, p: Params) -> float:
    """G_z*: the best expected goodput in zone ``z`` over every save schedule (module docstring)."""
    import numpy as np  # noqa: PLC0415 - only the ceiling needs it

    k, lam, c = p.weibull_k, z.scale_s, p.checkpoint_cost_s
    slack = p.notice_s - p.marker_margin_s
    end = lam * (-math.log(1e-9)) ** (1 / k) + slack + c  # survival 1e-9: nothing left to gain
    ages, t = [], 0.0
    while t < end:
        ages.append(t)
        t += max(5.0, 0.002 * t)
    grid = np.array(ages)
    surv = np.exp(-np.power(np.clip(grid - slack, 0.0, None) / lam, k))
    value = np.zeros_like(grid)
    n = len(grid)
    for j in range(n - 1, -1, -1):
        first = int(np.searchsorted(grid, grid[j] + c))
        if first < n:
            value[j] = max(0.0, float(np.max((grid[first:] - grid[j] - c) * surv[first:] + value[first:])))
    boots = _boot_points(p)
    at = [max(0, int(np.searchsorted(grid, b, side="right")) - 1) for b in boots]  # the age at or before b
    return float(np.mean(value[at])) / paid_per_life(z, p)


def best_zone_shares(trace: Trace) -> dict[str, float]:
    """The share of the time (when any zone is available) each zone is the best one available."""
    p = trace.params
    ranked = sorted(trace.zones.values(), key=lambda z: -z.mean_s)
    cuts = sorted({0.0, p.horizon_s, *(t for z in ranked for gap in z.stockouts for t in gap if t < p.horizon_s)})
    share = dict.fromkeys(trace.zones, 0.0)
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        best = next((z for z in ranked if not z.out_at(mid)), None)
        if best is not None:
            share[best.name] += b - a
    total = sum(share.values()) or 1.0
    return {z: s / total for z, s in share.items()}


def ceiling(trace: Trace) -> dict[str, Any]:
    """The upper bound (``goodput``), the ideal policy's expected goodput (``reference_ideal``)
    and the first-order Young/Daly figure, for one trace (module docstring)."""
    p = trace.params
    shares = best_zone_shares(trace)
    per_zone = {name: best_interval(z, p) for name, z in trace.zones.items()}
    bounds = {name: zone_bound(z, p) for name, z in trace.zones.items()}
    best = max(bounds, key=bounds.__getitem__)
    # The ideal is always running in the best zone available: its paid time in z is z's share.
    reference = sum(shares[n] * per_zone[n][1] for n in trace.zones)
    m = sum(shares[n] * z.mean_s for n, z in trace.zones.items())
    c, b = p.checkpoint_cost_s, sum(p.boot_s) / 2
    tau = math.sqrt(2 * c * m)
    young_daly_g = (tau / (tau + c)) * (1 - (b + (tau + c) / 2) / m)
    return {
        "goodput": bounds[best],
        "best_zone": best,
        "zone_bound": bounds,
        "reference_ideal": reference,
        "young_daly_goodput": young_daly_g,
        "young_daly_interval_s": tau,
        "mean_lifetime_s": m,
        "best_zone_shares": shares,
        "intervals_s": {n: v[0] for n, v in per_zone.items()},
        "zone_goodput_fixed_interval": {n: v[1] for n, v in per_zone.items()},
    }


def young_daly(c: float, m: float) -> float:
    return math.sqrt(2 * c * m)
