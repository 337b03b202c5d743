"""``make sim``: a week of a Spot training fleet, under each policy, on the same traces.

    python -m sim --sweep                  # make sim: the defaults (7 days, 8 jobs, 3 zones, 6 seeds) and the sweep
    python -m sim --days 0.25 --jobs 2     # a quick look
    python -m sim --help                   # every parameter

Prints the tables, writes ``sim/results.json`` and ``sim/results.png`` (``--out``, ``--plot``):
the headline (advice as Google gives it), the ``oracle`` section ("if advice were perfect"),
the ``ceiling`` (an upper bound) with its checks, and with ``--sweep`` the ``sweep``.
See ``sim/__init__.py`` for what is modelled, and ``sim/model.py`` for the ceiling.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from sim.fleet import DESCRIPTIONS, POLICIES, REFERENCE_POLICIES, quantile, run_policy
from sim.model import ZONE_NAMES, Params, ceiling, make_trace, young_daly

HERE = Path(__file__).resolve().parent
HELP = {
    "days": "simulated days",
    "jobs": "training jobs in the fleet (one VM each)",
    "zones": "zones every job may use",
    "seed": "seed of the first trace (zones' lifetimes and stockouts, every VM's draws)",
    "seeds": "independent traces (weeks) to run, seeds SEED, SEED+1, ...: goodput is their mean",
    "weibull_k": "Weibull shape of Spot lifetimes",
    "lifetime_median_h": "range the zones' median Spot lifetimes are drawn in (hours)",
    "stockout_median_h": "range the zones' median stockout gaps are drawn in (hours)",
    "stockout_p90_h": "range the zones' 90th-percentile stockout gaps are drawn in (hours)",
    "available_mean_h": "mean available period between stockout gaps (hours, exponential)",
    "boot_s": "boot time range: insert to the trainer training (seconds)",
    "checkpoint_cost_s": "checkpoint cost C: seconds a save takes, without training",
    "notice_s": "preemption notice: soft-off to hard-off (seconds)",
    "notice_miss": "probability that a VM misses the notice (no marker; only a tick sees the loss)",
    "marker_margin_s": "a save must land this long before the hard-off to count (seconds)",
    "event_delay_p50_s": "respawn's event delay, median: the marker written -> the event function's pass (seconds; "
                         "the bench's event_from_notice_p50_s)",
    "event_delay_p99_s": "respawn's event delay, 99th percentile (lognormal through both; the bench's "
                         "event_from_notice_p99_s)",
    "tick_s": "respawn's tick (seconds)",
    "poll_s": "the managed-jobs baseline's poll (seconds)",
    "poll_wait_s": "the managed-jobs baseline's wait before relaunching (seconds; SkyPilot: none, its 60 s gap follows a failed launch)",
    "retry_s": "a baseline's retry when no zone it tried had capacity (seconds)",
    "mig_check_s": "how often the MIG-like baseline notices a stopped VM (seconds)",
    "skypilot_poll_s": "SkyPilot's check of a running job (its JOB_STATUS_CHECK_GAP_SECONDS)",
    "skypilot_fetch_timeout_s": "SkyPilot's cap on fetching a job's status from its cluster (_JOB_STATUS_FETCH_TIMEOUT_SECONDS)",
    "skypilot_retry_s": "SkyPilot's first gap after a launch found no capacity (RETRY_INIT_GAP_SECONDS; x1.6 to 300 s)",
    "skypilot_launch_s": "SkyPilot's launch path beyond the VM's boot: SSH, runtime, Ray, job submission (the sim's choice)",
    "fixed_interval_s": "the fixed checkpoint interval of respawn-fixed-30m (seconds)",
    "keep_checkpoints": "complete saves a trainer keeps",
    "price_gpu_h": "Spot price, US$ per GPU-hour",
    "gpus_per_vm": "GPUs per VM",
    "policies": "the headline's policies (default: all but the ceiling's oracle checks, which always run)",
    "advice": "the headline's capacity advice: 'as-google-gives' (noisy, lagging scores; sim/advice.py), 'oracle' "
              "(each zone's true mean lifetime and live stockouts) or 'obtainability' (live stockouts only)",
    "advice_uptime_sigma": "as-google-gives: estimatedUptime is the zone's true median lifetime x lognormal(0, SIGMA)",
    "advice_uptime_refresh_h": "as-google-gives: the uptime's error is redrawn per zone this often (hours)",
    "advice_obtainability_sd": "as-google-gives: sd of the normal noise on the obtainability score (0.9 or 0.1)",
    "advice_obtainability_lag_s": "as-google-gives: the score reflects the zone's capacity this long ago (seconds)",
    "advice_rate_range": "as-google-gives: preemptionRate drawn per zone and day in this range (a fraction)",
    "train_h": "the fixed amount of training per job that time_to_train_h and usd_per_job are for (hours)",
}


def parse(argv: list[str] | None) -> tuple[Params, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = Params()
    for f in fields(Params):
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if f.name == "policies":
            ap.add_argument(flag, nargs="+", choices=[n for n in POLICIES if n not in REFERENCE_POLICIES],
                            default=list(HEADLINE), help=HELP[f.name])
        elif f.name == "advice":
            ap.add_argument(flag, choices=["as-google-gives", "oracle", "obtainability"], default=value,
                            help=HELP[f.name])
        elif isinstance(value, tuple):
            ap.add_argument(flag, nargs=2, type=float, default=list(value), metavar=("LOW", "HIGH"), help=HELP[f.name])
        else:
            ap.add_argument(flag, type=type(value), default=value, help=HELP[f.name])
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, len(POLICIES)),
                    help="processes (policies run side by side)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle section ('if advice were perfect')")
    ap.add_argument("--sweep", action="store_true",
                    help="also sweep the lifetime and stockout parameters (sim.__main__.SWEEP_POINTS)")
    ap.add_argument("--sweep-days", type=float, default=7.0, help="simulated days per run at a lifetime point")
    ap.add_argument("--sweep-seeds", type=int, default=20, help="seeds per lifetime point")
    ap.add_argument("--sweep-other-days", type=float, default=3.0, help="simulated days per run at a stockout point")
    ap.add_argument("--sweep-other-seeds", type=int, default=4, help="seeds per stockout point")
    ap.add_argument("--out", default=str(HERE / "results.json"), help="results file ('' for none)")
    ap.add_argument("--plot", default=str(HERE / "results.png"), help="plot file ('' for none)")
    ap.add_argument("--no-skip", action="store_true", help="run every tick (no skipping of ticks that cannot act)")
    ap.add_argument("--verify-skips", action="store_true",
                    help="dry-run every skipped tick and fail if it would have acted (slow)")
    args = ap.parse_args(argv)
    if args.days <= 0 or args.jobs < 1 or args.seeds < 1:
        ap.error("--days must be above 0, --jobs and --seeds at least 1")
    if not 1 <= args.zones <= len(ZONE_NAMES):
        ap.error(f"--zones: 1 to {len(ZONE_NAMES)} (the zones the sim names)")
    values = {f.name: getattr(args, f.name) for f in fields(Params)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return Params(**values), args


# Every policy the headline runs, on the same traces; three tables read them:
BASELINES = ("skypilot", "mig-regional", "poll-15s", "mig-same-zone")
# ... respawn as shipped against the peers as their authors built them (each trainer on the
# interval its controller gives it, or, for peers that give none, Young/Daly from the zones'
# published uptime: the best a user could compute);
AS_BUILT = ("respawn", *BASELINES)
# ... the controllers alone: every trainer on that same Young/Daly interval;
CONTROLLERS = ("respawn-young-daly", "respawn-tick-only", *BASELINES)
# ... and the interval policies alone, under respawn's controller.
INTERVALS = ("respawn", "respawn-young-daly", "respawn-fixed-30m", "respawn-optimal")
HEADLINE = tuple(dict.fromkeys((*AS_BUILT, *CONTROLLERS, *INTERVALS)))
ORACLE = ("respawn", "skypilot", "mig-regional", "poll-15s")  # "if advice were perfect": respawn and the baselines
# The sweep: one parameter group at a time around the defaults, respawn as shipped against the
# peers as built.
SWEEP_POLICIES = ("respawn", "skypilot", "mig-regional", "poll-15s")
# The lifetime points run --sweep-seeds x --sweep-days (the numbers that decide: 20 x 7 by
# default); the stockout points, fewer (--sweep-other-seeds x --sweep-other-days), to keep make
# sim under an hour on 2 CPUs: their spread is the wider.
LIFETIME, OTHER = "lifetime", "other"
SWEEP_POINTS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("lifetime median 0.25-0.5 h", {"lifetime_median_h": (0.25, 0.5)}, LIFETIME),
    ("lifetime median 0.5-1.1 h (default)", {}, LIFETIME),
    ("lifetime median 1.1-3 h", {"lifetime_median_h": (1.1, 3.0)}, LIFETIME),
    ("lifetime median 3-8 h", {"lifetime_median_h": (3.0, 8.0)}, LIFETIME),
    ("stockout gaps x0.5 (median 0.2-0.375 h, p90 1-2 h)",
     {"stockout_median_h": (0.2, 0.375), "stockout_p90_h": (1.0, 2.0)}, OTHER),
    ("stockout gaps x2 (median 0.8-1.5 h, p90 4-8 h)", {"stockout_median_h": (0.8, 1.5), "stockout_p90_h": (4.0, 8.0)},
     OTHER),
    ("available periods 2 h (frequent stockouts)", {"available_mean_h": 2.0}, OTHER),
    ("available periods 24 h (rare stockouts)", {"available_mean_h": 24.0}, OTHER),
)
# Per metric: the key in a run, its unit in a margin, its scale, and whether higher is better.
METRICS = (("goodput", "goodput_pp", 100.0, True), ("time_to_train_h", "time_to_train_h", 1.0, False),
           ("usd_per_job", "usd_per_job", 1.0, False), ("training_share", "training_share_pp", 100.0, True))
ADVICE_NOTE = {
    "as-google-gives": "advice as Google gives it (sim/advice.py): obtainability a noisy score of the zone's capacity "
                       "{lag:g} s ago (sd {sd:g}, in tenths), estimatedUptime the zone's true median lifetime x "
                       "lognormal(0, {sigma:g}) redrawn every {refresh:g} h, preemptionRate a fraction 0..1 unrelated "
                       "to lifetime; no policy in this section sees lifetime truth (the baselines' Young/Daly "
                       "interval uses the mean of the zones' estimatedUptime)",
    "oracle": "if advice were perfect: estimatedUptime is each zone's true mean lifetime and obtainability is 0 "
              "exactly while a zone is stocked out; the baselines' interval uses the true mean lifetime",
    "obtainability": "live stockouts only (a perfect obtainability oracle), no uptime or preemption rate",
}


def _run(args: tuple[Any, ...]) -> dict[str, Any]:
    trace, policy, skip_ticks, verify_skips = args
    return run_policy(trace, policy, skip_ticks, verify_skips)


def _pool(jobs: dict[Any, tuple[Any, ...]], workers: int) -> dict[Any, dict[str, Any]]:
    """Run every (trace, policy) of ``jobs``; the engine's policies first, so that the pool ends together."""
    order = sorted(jobs, key=lambda k: POLICIES[jobs[k][1]][0] != "engine")
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            futures = {k: pool.submit(_run, jobs[k]) for k in order}
            return {k: futures[k].result() for k in jobs}
    return {k: _run(jobs[k]) for k in jobs}


def simulate(p: Params, workers: int = 1, skip_ticks: bool = True, verify_skips: bool = False,
             oracle: bool = True, sweep: bool = False, sweep_days: float = 7.0, sweep_seeds: int = 20,
             sweep_other_days: float = 3.0, sweep_other_seeds: int = 4) -> dict[str, Any]:
    """The headline (advice ``p.advice``), the oracle section, the ceiling and its checks, and
    optionally the sweep: the results.json document."""
    chosen = [n for n in (p.policies or HEADLINE) if n not in REFERENCE_POLICIES]
    seeds = [p.seed + i for i in range(max(1, p.seeds))]
    sections = {"headline": (p.advice, chosen)}
    if oracle and p.advice != "oracle":
        sections["oracle"] = ("oracle", [n for n in ORACLE if n in chosen] or list(ORACLE))
    traces = {(adv, s): make_trace(replace(p, seed=s, advice=adv)) for adv, _ in sections.values() for s in seeds}
    jobs: dict[Any, tuple[Any, ...]] = {}
    for sec, (adv, names_) in sections.items():
        for s in seeds:
            for n in names_:
                jobs[(sec, s, n)] = (traces[(adv, s)], n, skip_ticks, verify_skips)
    for s in seeds:  # the ceiling's checks see the truth whatever the advice
        for n in REFERENCE_POLICIES:
            jobs[("reference", s, n)] = (traces[(p.advice, s)], n, skip_ticks, verify_skips)
    sweep_jobs: dict[Any, tuple[Any, ...]] = {}
    sweep_traces: dict[Any, Any] = {}
    sizes = {LIFETIME: (sweep_days, sweep_seeds), OTHER: (sweep_other_days, sweep_other_seeds)}
    if sweep:
        for i, (_, change, kind) in enumerate(SWEEP_POINTS):
            days, n_seeds = sizes[kind]
            q = replace(p, days=days, seeds=n_seeds, **change)
            for s in range(p.seed, p.seed + n_seeds):
                sweep_traces[(i, s)] = make_trace(replace(q, seed=s))
                for n in SWEEP_POLICIES:
                    sweep_jobs[("sweep", i, s, n)] = (sweep_traces[(i, s)], n, skip_ticks, verify_skips)
    started, cpu = time.perf_counter(), _cpu()
    raw = _pool({**jobs, **sweep_jobs}, workers)
    wall, cpu = time.perf_counter() - started, _cpu() - cpu
    tops = {s: ceiling(traces[(p.advice, s)]) for s in seeds}
    bound = {s: t["goodput"] for s, t in tops.items()}

    doc: dict[str, Any] = {"advice": p.advice, "advice_note": _advice_note(p.advice, p)}
    doc["parameters"] = {**p.as_dict(), "policies": chosen, "seeds_run": seeds}
    runs = {n: {s: raw[("headline", s, n)] for s in seeds} for n in chosen}
    head = section(runs, bound, against=AS_BUILT)
    doc["policies"], doc["margins"] = head["policies"], head["margins"]
    doc["goodput"] = {n: r["goodput"] for n, r in head["policies"].items()}
    for key, names_, what in (
            ("controllers", CONTROLLERS, "the controllers alone: every trainer on the same interval, Young/Daly from "
                                         "the zones' published uptime (what the peers' users have)"),
            ("intervals", INTERVALS, "the interval policies alone, under respawn's controller")):
        if (table_ := comparison(runs, head["policies"], names_, what)) is not None:
            doc[key] = table_
    if "oracle" in sections:
        names_ = sections["oracle"][1]
        orc = section({n: {s: raw[("oracle", s, n)] for s in seeds} for n in names_}, bound)
        doc["oracle"] = {"label": "if advice were perfect", "advice": "oracle", "advice_note": ADVICE_NOTE["oracle"],
                         **orc}
        # Each policy with perfect advice minus itself with advice as Google gives it. For the
        # baselines, whose placement asks no advice, this is their interval alone (Young/Daly from
        # the true mean lifetime instead of from the zones' estimatedUptime): the part of
        # respawn's headline margin that comes from the baselines' interval.
        doc["oracle"]["gain_from_perfect_advice"] = {
            n: margins({s: raw[("oracle", s, n)] for s in seeds}, {s: raw[("headline", s, n)] for s in seeds})
            for n in names_ if n in chosen}
    refs = section({n: {s: raw[("reference", s, n)] for s in seeds} for n in REFERENCE_POLICIES}, bound)["policies"]
    doc["ceiling"] = ceiling_section(p, tops, {"headline": head["policies"], "oracle": doc.get("oracle", {}).get(
        "policies", {}), "reference": refs}, {sec: {n: {s: raw[(k, s, n)]["goodput"] for s in seeds} for n in ns}
                                               for sec, k, ns in (("headline", "headline", chosen),
                                                                  ("oracle", "oracle", sections.get("oracle", ("", []))[1]),
                                                                  ("reference", "reference", REFERENCE_POLICIES))})
    if sweep:
        doc["sweep"] = sweep_section(p, raw, sweep_traces, sizes)
    doc["zones"] = {str(s): {n: {"lifetime_median_h": z.lifetime_median_s / 3600, "lifetime_mean_h": z.mean_s / 3600,
                                 "stockout_median_h": z.stockout_median_s / 3600,
                                 "stockout_p90_h": z.stockout_p90_s / 3600,
                                 "stockout_share": z.out_fraction(p.horizon_s), "stockouts": len(z.stockouts)}
                             for n, z in traces[(p.advice, s)].zones.items()} for s in seeds}
    yd = young_daly(p.checkpoint_cost_s, statistics.fmean(traces[(p.advice, s)].mean_lifetime_s for s in seeds))
    doc["young_daly_interval_s_true_mean"] = yd
    doc["interval_advice"] = {
        "from_controller_metadata": {n: r["counters"]["interval_controller"] for n, r in head["policies"].items()
                                     if POLICIES[n][1] == "advice"},
        "computed_by_the_sim": {n: r["counters"]["interval_sim"] for n, r in head["policies"].items()
                                if POLICIES[n][1] == "advice"},
    }
    doc["descriptions"] = {n: DESCRIPTIONS[n] for n in [*chosen, *REFERENCE_POLICIES, "ceiling"]}
    doc["wall_s"] = wall
    doc["cpu_s"] = cpu  # this process and its workers: what the runs cost whatever else shares the CPUs
    doc["machine"] = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                      f"{min(workers, len(jobs) + len(sweep_jobs))} worker process(es)")
    return doc


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _advice_note(advice: str, p: Params) -> str:
    return ADVICE_NOTE[advice].format(lag=p.advice_obtainability_lag_s, sd=p.advice_obtainability_sd,
                                      sigma=p.advice_uptime_sigma, refresh=p.advice_uptime_refresh_h)


def section(raw: dict[str, dict[int, dict[str, Any]]], bound: dict[int, float], lead: str = "respawn",
            against: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Policies pooled over seeds, each against the ceiling, and ``lead``'s margins over the
    others (``against``: only those)."""
    out: dict[str, Any] = {"policies": {}, "margins": {}}
    for n, by_seed in raw.items():
        r = pooled(list(by_seed.values()))
        gaps = [(run["goodput"] - bound[s]) * 100 for s, run in by_seed.items()]
        r["vs_ceiling_pp"] = statistics.fmean(gaps)
        r["vs_ceiling_pp_sd_over_seeds"] = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
        out["policies"][n] = r
    if lead in raw:
        for n in raw:
            if n != lead and (against is None or n in against):
                out["margins"][n] = margins(raw[lead], raw[n])
    return out


def comparison(runs: dict[str, dict[int, dict[str, Any]]], pooled_: dict[str, Any], names_: tuple[str, ...],
               what: str) -> dict[str, Any] | None:
    """One table read from the headline's runs: ``names_`` (the first leads), its margins over the
    rest; None where the headline did not run them all."""
    if not all(n in runs for n in names_):
        return None
    lead = names_[0]
    return {"what": what, "lead": lead, "policies": list(names_),
            "margins": {n: margins(runs[lead], runs[n]) for n in names_[1:]},
            "goodput": {n: pooled_[n]["goodput"] for n in names_}}


# Two-sided 95 % critical values of Student's t by degrees of freedom (seeds - 1): with 4 or
# 6 seeds a normal's 2 (1.96) would call "ahead" what a t-test calls noise.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042}


def t95(df: int) -> float:
    """Student's t two-sided 95 % critical value for ``df`` degrees of freedom (conservative between table rows)."""
    return _T95[max(k for k in _T95 if k <= df)] if df <= 30 else 1.96


def margins(mine: dict[int, dict[str, Any]], other: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``mine`` minus ``other`` per metric, seed by seed (the policies share each seed's draws):
    mean, sd over seeds, in how many seeds ``mine`` was better, and a verdict: ahead or behind
    where a paired t-test over the seeds says so at 95 % (|mean| > t95(n-1) * sd / sqrt(n)),
    else within noise. Not corrected for the many comparisons a table makes."""
    out: dict[str, Any] = {}
    seeds = sorted(set(mine) & set(other))
    for key, unit, scale, higher in METRICS:
        d = [(mine[s][key] - other[s][key]) * scale for s in seeds]
        mean = statistics.fmean(d)
        sd = statistics.stdev(d) if len(d) > 1 else 0.0
        better = sum((x > 0) if higher else (x < 0) for x in d)
        censored = key in ("time_to_train_h", "usd_per_job") and any(
            r[s]["jobs_unfinished"] for r in (mine, other) for s in seeds)
        if censored:
            verdict = "censored: some job did not finish train_h in the horizon (the horizon counted)"
        elif len(d) < 2:
            verdict = "one seed: no spread"
        elif abs(mean) <= t95(len(d) - 1) * sd / math.sqrt(len(d)):
            verdict = "within noise"
        else:
            verdict = "ahead" if (mean > 0) == higher else "behind"
        out[unit] = {"mean": mean, "sd": sd, "better_in_seeds": better, "seeds": len(d), "verdict": verdict,
                     "better_when": "positive" if higher else "negative"}
    return out


def ceiling_section(p: Params, tops: dict[int, dict[str, Any]], pooled_: dict[str, dict[str, Any]],
                    per_seed: dict[str, dict[str, dict[int, float]]]) -> dict[str, Any]:
    seeds = sorted(tops)
    top = statistics.fmean(t["goodput"] for t in tops.values())
    exceeded = [f"{sec}/{n}" for sec, rs in pooled_.items() for n, r in rs.items() if r["goodput"] > top]
    in_seeds = [{"policy": f"{sec}/{n}", "seed": s, "by_pp": (g - tops[s]["goodput"]) * 100}
                for sec, ns in per_seed.items() for n, gs in ns.items() for s, g in gs.items() if g > tops[s]["goodput"]]
    ref = statistics.fmean(t["reference_ideal"] for t in tops.values())
    over_ref = [f"{sec}/{n}" for sec, rs in pooled_.items() for n, r in rs.items() if r["goodput"] > ref]
    if exceeded:
        note = (f"EXCEEDED: {', '.join(exceeded)} measured above the bound's mean {top:.4f}. The bound is on "
                f"expectations; a finite run's ratio can pass it by noise (see exceeded_in_seeds)")
    else:
        note = f"no policy's mean goodput exceeded the bound ({top:.4f})"
    if in_seeds:
        note += (f"; in single seeds {len(in_seeds)} run(s) measured above that seed's bound (finite-week noise, "
                 f"largest {max(x['by_pp'] for x in in_seeds):+.2f} pp)")
    note += (f". The ideal policy's expected goodput ({ref:.4f}, reference_ideal) is a reference, not a bound: "
             f"{', '.join(over_ref) or 'no policy'} measured above it")
    return {
        "goodput": top,
        "kind": "upper bound",
        "definition": "max over zones of E_b[V(b)] / (E[L_z] + notice): the best zone's best expected committed "
                      "training per billed second over every save schedule (age-dependent allowed); "
                      "V(t) = max(0, max_{t' >= t + C} (t' - t - C) S(t' - slack) + V(t')), sim/model.py",
        "exceeded_by": exceeded,
        "exceeded_in_seeds": in_seeds,
        "note": note,
        "reference_ideal": ref,
        "reference_ideal_exceeded_by": over_ref,
        "young_daly_goodput": statistics.fmean(t["young_daly_goodput"] for t in tops.values()),
        "checks": {n: {"description": DESCRIPTIONS[n], **r} for n, r in pooled_["reference"].items()},
        "per_seed": {str(s): tops[s] for s in seeds},
    }


def sweep_section(p: Params, raw: dict[Any, dict[str, Any]], traces: dict[Any, Any],
                  sizes: dict[str, tuple[float, int]]) -> dict[str, Any]:
    points = []
    for i, (label, change, kind) in enumerate(SWEEP_POINTS):
        days, n_seeds = sizes[kind]
        seeds = list(range(p.seed, p.seed + n_seeds))
        runs = {n: {s: raw[("sweep", i, s, n)] for s in seeds} for n in SWEEP_POLICIES}
        bounds = {s: ceiling(traces[(i, s)])["goodput"] for s in seeds}
        sec = section(runs, bounds)
        top = statistics.fmean(bounds.values())
        points.append({
            "label": label,
            "kind": kind,
            "days": days,
            "seeds": n_seeds,
            "parameters": {k: list(v) if isinstance(v, tuple) else v for k, v in change.items()},
            "ceiling": top,
            "exceeded_by": [n for n, r in sec["policies"].items() if r["goodput"] > top],
            "policies": {n: {k: r[k] for k in ("goodput", "goodput_sd_over_seeds", "time_to_train_h",
                                                "time_to_train_h_sd_over_seeds", "usd_per_job",
                                                "usd_per_job_sd_over_seeds", "training_share", "jobs_unfinished",
                                                "vs_ceiling_pp")}
                         for n, r in sec["policies"].items()},
            "margins": sec["margins"],
        })
    (days, n_seeds), (other_days, other_seeds) = sizes[LIFETIME], sizes[OTHER]
    return {
        "advice": p.advice,
        "days": days,
        "seeds": n_seeds,
        "other_days": other_days,
        "other_seeds": other_seeds,
        "policies": list(SWEEP_POLICIES),
        "note": f"one parameter group at a time around the defaults; the lifetime points {days:g} days x {n_seeds} "
                f"seeds, the stockout points {other_days:g} days x {other_seeds} seeds (wider spread); advice "
                f"{p.advice}",
        "points": points,
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy over several seeds: means per week, percentiles over every recovery."""
    mean = lambda key: statistics.fmean(r[key] for r in runs)  # noqa: E731
    sd = lambda key: statistics.stdev(r[key] for r in runs) if len(runs) > 1 else 0.0  # noqa: E731
    recoveries = [x for r in runs for x in r["recoveries_s"]]
    resumes = [x for r in runs for x in r["resumes_s"]]
    useful_h = sum(r["accelerator_hours_useful"] for r in runs)
    counters: dict[str, int] = {}
    for r in runs:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
    intervals = [r["mean_interval_s"] for r in runs if r["mean_interval_s"] is not None]
    out = {
        "goodput": mean("goodput"),
        "goodput_sd_over_seeds": sd("goodput"),
        "time_to_train_h": mean("time_to_train_h"),
        "time_to_train_h_sd_over_seeds": sd("time_to_train_h"),
        "usd_per_job": mean("usd_per_job"),
        "usd_per_job_sd_over_seeds": sd("usd_per_job"),
        "training_share": mean("training_share"),
        "training_share_sd_over_seeds": sd("training_share"),
        "jobs_unfinished": sum(r["jobs_unfinished"] for r in runs),
        "recovery_p50_s": quantile(recoveries, 0.5),
        "recovery_p99_s": quantile(recoveries, 0.99),
        "resume_p50_s": quantile(resumes, 0.5),
        "resume_p99_s": quantile(resumes, 0.99),
        "accelerator_hours_paid": mean("accelerator_hours_paid"),
        "accelerator_hours_useful": mean("accelerator_hours_useful"),
        "accelerator_hours_lost": mean("accelerator_hours_lost"),
        "cost": mean("cost"),
        "cost_per_useful_accelerator_hour": sum(r["cost"] for r in runs) / useful_h if useful_h else None,
        "losses": sum(r["losses"] for r in runs),
        "unrecovered_at_end": sum(r["unrecovered_at_end"] for r in runs),
        "mean_interval_s": statistics.fmean(intervals) if intervals else None,
        "counters": counters,
        "errors": [e for r in runs for e in r["errors"]][:20],
    }
    ledgers = [r.get("controller_ledger") for r in runs]
    if ledgers and all(isinstance(x, dict) and x.get("accelerator_hours") for x in ledgers):
        paid = sum(x["accelerator_hours"] for x in ledgers)  # type: ignore[index]
        useful = sum(x["useful_hours"] for x in ledgers)  # type: ignore[index]
        out["controller_ledger_goodput"] = useful / paid if paid else None
    elif any(ledgers):
        out["controller_ledger_goodput"] = None
        out["controller_ledger_note"] = next((x.get("error") for x in ledgers if isinstance(x, dict) and x.get("error")),
                                             "unavailable")
    return out


def table(title: str, policies: dict[str, Any]) -> Any:
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=title)
    t.add_column("policy", no_wrap=True)
    for col in ("goodput", "vs ceiling", "time to train", "$/job", "training share", "recovery p50/p99",
                "resume p50/p99", "interval"):
        t.add_column(col, justify="right")
    for name, r in policies.items():
        t.add_row(name, f"{r['goodput']:.4f}",
                  f"{r['vs_ceiling_pp']:+.2f} ±{r['vs_ceiling_pp_sd_over_seeds']:.2f} pp",
                  f"{r['time_to_train_h']:.2f} h" + ("*" if r["jobs_unfinished"] else ""),
                  f"${r['usd_per_job']:.2f}", f"{r['training_share']:.1%}",
                  f"{_s(r['recovery_p50_s'])} / {_s(r['recovery_p99_s'])}",
                  f"{_s(r['resume_p50_s'])} / {_s(r['resume_p99_s'])}",
                  _s(r["mean_interval_s"]))
    return t


def margin_lines(label: str, m: dict[str, Any], lead: str = "respawn") -> list[str]:
    out = []
    for name, metrics in m.items():
        parts = []
        for unit, v in metrics.items():
            parts.append(f"{unit} {v['mean']:+.2f} (sd {v['sd']:.2f}, better in {v['better_in_seeds']}/{v['seeds']}: "
                         f"{v['verdict']})")
        out.append(f"{label} {lead} vs {name}: " + "; ".join(parts))
    return out


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def plot(doc: dict[str, Any], path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = [(n, r, "#1f77b4" if n.startswith("respawn") else "#999999") for n, r in doc["policies"].items()]
    rows += [(f"{n} (oracle)", r, "#9ecae1" if n.startswith("respawn") else "#d9d9d9")
             for n, r in doc.get("oracle", {}).get("policies", {}).items()]
    rows += [(n, doc["ceiling"]["checks"][n], "#2ca02c") for n in doc["ceiling"]["checks"]]
    names_ = [r[0] for r in rows]
    colours = [r[2] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.2))
    panels = ((left, [r[1]["goodput"] for r in rows], "goodput (useful / billed GPU time)", "{:.3f}"),
              (right, [r[1]["time_to_train_h"] for r in rows],
               f"hours to finish {doc['parameters']['train_h']:g} h of training (lower is better)", "{:.1f}"))
    for ax, values, label, fmt in panels:
        bars = ax.bar(names_, values, color=colours)
        for bar, v in zip(bars, values, strict=True):
            ax.annotate(fmt.format(v), (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=7)
        ax.set_ylabel(label)
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right", fontsize=8)
    top = doc["ceiling"]["goodput"]
    left.axhline(top, color="#d62728", linestyle="--", label=f"ceiling (upper bound) {top:.3f}")
    ref = doc["ceiling"]["reference_ideal"]
    left.axhline(ref, color="#ff9896", linestyle=":", label=f"ideal policy's expectation (reference) {ref:.3f}")
    goodputs = [r[1]["goodput"] for r in rows]
    left.set_ylim(max(0.0, min([*goodputs, top]) - 0.03), min(1.0, max([*goodputs, top]) + 0.01))
    left.legend(loc="upper left", fontsize=7)
    times = [r[1]["time_to_train_h"] for r in rows]
    right.set_ylim(max(0.0, min(times) - 2), max(times) + 1)
    p = doc["parameters"]
    fig.suptitle(f"respawn fleet simulator: {p['days']:g} days x {len(p['seeds_run'])} seeds, {p['jobs']} jobs, "
                 f"{p['zones']} zones; headline advice: {doc['advice']} (pale: oracle advice; green: the ceiling's "
                 f"oracle checks)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console  # noqa: PLC0415

    p, args = parse(argv)
    console = Console(width=170)
    doc = simulate(p, workers=args.workers, skip_ticks=not args.no_skip, verify_skips=args.verify_skips,
                   oracle=not args.no_oracle, sweep=args.sweep, sweep_days=args.sweep_days, sweep_seeds=args.sweep_seeds,
                   sweep_other_days=args.sweep_other_days, sweep_other_seeds=args.sweep_other_seeds)
    n_seeds = len(doc["parameters"]["seeds_run"])
    size = f"{p.days:g} simulated days x {n_seeds} seeds, {p.jobs} jobs, {p.zones} zones"
    console.print(table(f"HEADLINE, advice {doc['advice']}: {size} (means per week; * some job did not finish "
                        f"{p.train_h:g} h of training in time: the horizon counted)", doc["policies"]))
    console.print(doc["advice_note"])
    for line in margin_lines("[as shipped, as built]", doc["margins"]):
        console.print(line, markup=False)
    for key in ("controllers", "intervals"):
        if key in doc:
            console.print(f"[{key}] {doc[key]['what']}", markup=False)
            for line in margin_lines(f"[{key}]", doc[key]["margins"], doc[key]["lead"]):
                console.print(line, markup=False)
    if "oracle" in doc:
        console.print(table(f"ORACLE, {doc['oracle']['label']}: {size}", doc["oracle"]["policies"]))
        for line in margin_lines("[oracle]", doc["oracle"]["margins"]):
            console.print(line, markup=False)
        for n, m in doc["oracle"]["gain_from_perfect_advice"].items():
            g = m["goodput_pp"]
            what = "placement and first interval" if POLICIES[n][0] == "engine" else "its interval alone"
            console.print(f"{n} with perfect advice vs as Google gives it ({what}): {g['mean']:+.2f} pp goodput "
                          f"(sd {g['sd']:.2f}, better in {g['better_in_seeds']}/{g['seeds']})")
    c = doc["ceiling"]
    console.print(table(f"CEILING CHECKS (oracle policies): bound {c['goodput']:.4f}", c["checks"]))
    console.print(f"ceiling: {c['goodput']:.4f} (upper bound: the best zone, best save schedule); {c['note']}")
    if "sweep" in doc:
        from rich.table import Table  # noqa: PLC0415

        sw = doc["sweep"]
        t = Table(title=f"SWEEP ({sw['note']}): respawn's margins, mean ± sd over seeds [better in n seeds]")
        t.add_column("point", no_wrap=True)
        t.add_column("ceiling", justify="right")
        t.add_column("respawn goodput", justify="right")
        for n in sw["policies"][1:]:
            t.add_column(f"vs {n}: time to train h", justify="right")
            t.add_column(f"vs {n}: $/job", justify="right")
        for pt in sw["points"]:
            cells = [f"{pt['label']} ({pt['days']:g} d x {pt['seeds']})", f"{pt['ceiling']:.4f}",
                     f"{pt['policies']['respawn']['goodput']:.4f}"]
            for n in sw["policies"][1:]:
                for unit in ("time_to_train_h", "usd_per_job"):
                    v = pt["margins"][n][unit]
                    cells.append(f"{v['mean']:+.2f} ±{v['sd']:.2f} [{v['better_in_seeds']}/{v['seeds']}]")
            t.add_row(*cells)
        console.print(t)
    used = doc["interval_advice"]
    for name, n in used["from_controller_metadata"].items():
        m = used["computed_by_the_sim"][name]
        note = "" if not m else f"; {m} VMs had no {INTERVAL_HINT} in metadata: the baselines' Young/Daly interval"
        console.print(f"{name}: {n} VMs took the controller's interval{note}")
    for sec in ("policies",):
        for name, r in doc[sec].items():
            if r["errors"]:
                console.print(f"[yellow]{name}: {r['counters']['pass_errors']} pass errors (not capacity), "
                              f"e.g. {r['errors'][0]}")
    console.print(f"wall time {doc['wall_s']:.1f} s, CPU {doc['cpu_s']:.1f} s ({doc['machine']})")
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
        console.print(f"wrote {args.out}")
    if args.plot:
        plot(doc, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


INTERVAL_HINT = "respawn-checkpoint-every-s"

if __name__ == "__main__":
    sys.exit(main())
