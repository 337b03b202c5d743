"""``make sim``: a week of a Spot training fleet, under each policy, on the same traces.

    python -m sim                          # the defaults: 7 days, 8 jobs, 3 zones
    python -m sim --days 0.25 --jobs 2     # a quick look
    python -m sim --help                   # every parameter

Prints a table, writes ``sim/results.json`` and ``sim/results.png`` (``--out``, ``--plot``).
See ``sim/__init__.py`` for what is modelled, and ``sim/model.py`` for the ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from sim.fleet import DESCRIPTIONS, POLICIES, quantile, run_policy
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
    "event_delay_s": "object finalized -> the event function runs (seconds)",
    "tick_s": "respawn's tick (seconds)",
    "poll_s": "the managed-jobs baseline's poll (seconds)",
    "poll_wait_s": "the managed-jobs baseline's wait before recovering (seconds)",
    "retry_s": "a baseline's retry when no zone it tried had capacity (seconds)",
    "mig_check_s": "how often the MIG-like baseline notices a stopped VM (seconds)",
    "fixed_interval_s": "the fixed checkpoint interval of respawn-fixed-30m (seconds)",
    "keep_checkpoints": "complete saves a trainer keeps",
    "price_gpu_h": "Spot price, US$ per GPU-hour",
    "gpus_per_vm": "GPUs per VM",
    "policies": "policies to run (default: all)",
    "advice": "what capacity advice tells respawn: 'true' (each zone's true mean lifetime and obtainability) "
              "or 'obtainability' (only whether a zone has capacity now)",
}


def parse(argv: list[str] | None) -> tuple[Params, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = Params()
    for f in fields(Params):
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if f.name == "policies":
            ap.add_argument(flag, nargs="+", choices=list(POLICIES), default=list(POLICIES), help=HELP[f.name])
        elif f.name == "advice":
            ap.add_argument(flag, choices=["true", "obtainability"], default=value, help=HELP[f.name])
        elif isinstance(value, tuple):
            ap.add_argument(flag, nargs=2, type=float, default=list(value), metavar=("LOW", "HIGH"), help=HELP[f.name])
        else:
            ap.add_argument(flag, type=type(value), default=value, help=HELP[f.name])
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, len(POLICIES)),
                    help="processes (policies run side by side)")
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


def simulate(p: Params, workers: int = 1, skip_ticks: bool = True, verify_skips: bool = False) -> dict[str, Any]:
    """Every policy over the same traces, and the ceiling: the results.json document."""
    chosen = list(p.policies or POLICIES)
    seeds = [p.seed + i for i in range(max(1, p.seeds))]
    traces = {s: make_trace(replace(p, seed=s)) for s in seeds}
    runs = [(s, n) for s in seeds for n in chosen]
    started = time.perf_counter()
    if workers > 1 and len(runs) > 1:
        # The engine's policies cost the most: they go first, so that the pool ends together.
        order = sorted(runs, key=lambda r: POLICIES[r[1]][0] != "engine")
        with ProcessPoolExecutor(max_workers=min(workers, len(runs))) as pool:
            futures = {r: pool.submit(run_policy, traces[r[0]], r[1], skip_ticks, verify_skips) for r in order}
            raw = {r: futures[r].result() for r in runs}
    else:
        raw = {r: run_policy(traces[r[0]], r[1], skip_ticks, verify_skips) for r in runs}
    wall = time.perf_counter() - started
    tops = {s: ceiling(t) for s, t in traces.items()}
    results = {n: pooled([raw[(s, n)] for s in seeds]) for n in chosen}
    top = statistics.fmean(t["goodput"] for t in tops.values())
    for n, r in results.items():
        # Policies share each seed's draws: their differences are far less noisy than their levels.
        gaps = [(raw[(s, n)]["goodput"] - tops[s]["goodput"]) * 100 for s in seeds]
        r["vs_ceiling_pp"] = statistics.fmean(gaps)
        r["vs_ceiling_pp_stdev_over_seeds"] = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
        if "respawn" in chosen and n != "respawn":
            ahead = [(raw[(s, "respawn")]["goodput"] - raw[(s, n)]["goodput"]) * 100 for s in seeds]
            r["respawn_ahead_pp"] = statistics.fmean(ahead)
            r["respawn_ahead_in_seeds"] = sum(a > 0 for a in ahead)
    yd = young_daly(p.checkpoint_cost_s, statistics.fmean(t.mean_lifetime_s for t in traces.values()))
    return {
        "parameters": {**p.as_dict(), "policies": chosen, "seeds_run": seeds},
        "policies": results,
        "goodput": {n: r["goodput"] for n, r in results.items()},
        "ceiling": top,
        "ceiling_detail": {
            "formula": "G = sum_z w_z E[U_z(tau_z*)] / sum_z w_z E[L_z], E[U_z(tau)] = tau * sum_{i>=1} "
                       "E_b[S_z(b + i(tau + C) - (notice - margin))]; w_z: share of time z is the best zone "
                       "available (sim/model.py)",
            "young_daly_goodput": statistics.fmean(t["young_daly_goodput"] for t in tops.values()),
            "per_seed": {str(s): t for s, t in tops.items()},
        },
        "per_seed_goodput": {str(s): {**{n: raw[(s, n)]["goodput"] for n in chosen}, "ceiling": tops[s]["goodput"]}
                             for s in seeds},
        "zones": {str(s): {n: {"lifetime_median_h": z.lifetime_median_s / 3600, "lifetime_mean_h": z.mean_s / 3600,
                               "stockout_median_h": z.stockout_median_s / 3600,
                               "stockout_p90_h": z.stockout_p90_s / 3600,
                               "stockout_share": z.out_fraction(p.horizon_s), "stockouts": len(z.stockouts)}
                           for n, z in t.zones.items()} for s, t in traces.items()},
        "young_daly_interval_s_sim": yd,
        "interval_advice": {
            "from_controller_metadata": {n: r["counters"]["interval_controller"] for n, r in results.items()
                                         if POLICIES[n][1] == "advice"},
            "computed_by_the_sim": {n: r["counters"]["interval_sim"] for n, r in results.items()
                                    if POLICIES[n][1] == "advice"},
        },
        "descriptions": {n: DESCRIPTIONS[n] for n in [*chosen, "ceiling"]},
        "wall_s": wall,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                   f"{min(workers, len(runs))} worker process(es)",
    }


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy over several seeds: means per week, percentiles over every recovery."""
    mean = lambda key: statistics.fmean(r[key] for r in runs)  # noqa: E731
    recoveries = [x for r in runs for x in r["recoveries_s"]]
    resumes = [x for r in runs for x in r["resumes_s"]]
    goodputs = [r["goodput"] for r in runs]
    useful_h = sum(r["accelerator_hours_useful"] for r in runs)
    counters: dict[str, int] = {}
    for r in runs:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
    intervals = [r["mean_interval_s"] for r in runs if r["mean_interval_s"] is not None]
    out = {
        "goodput": statistics.fmean(goodputs),
        "goodput_stdev_over_seeds": statistics.stdev(goodputs) if len(goodputs) > 1 else 0.0,
        "recovery_p50_s": quantile(recoveries, 0.5),
        "recovery_p99_s": quantile(recoveries, 0.99),
        "resume_p50_s": quantile(resumes, 0.5),
        "resume_p99_s": quantile(resumes, 0.99),
        "accelerator_hours_paid": mean("accelerator_hours_paid"),
        "accelerator_hours_useful": mean("accelerator_hours_useful"),
        "accelerator_hours_lost": mean("accelerator_hours_lost"),
        "cost": mean("cost"),
        "cost_per_useful_accelerator_hour": sum(r["cost"] for r in runs) / useful_h if useful_h else None,
        "training_share_of_wall_time": mean("training_share_of_wall_time"),
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


def table(doc: dict[str, Any]) -> Any:
    from rich.table import Table  # noqa: PLC0415

    p = doc["parameters"]
    seeds = doc["parameters"]["seeds_run"]
    t = Table(title=f"{p['days']:g} simulated days x {len(seeds)} seeds, {p['jobs']} jobs, {p['zones']} zones "
                    f"(means per week; percentiles over every loss)")
    t.add_column("policy", no_wrap=True)
    for col in ("goodput", "vs ceiling", "recovery p50/p99", "resume p50/p99", "GPU-h lost", "cost",
                "$/useful GPU-h", "training share", "interval"):
        t.add_column(col, justify="right")
    top = doc["ceiling"]
    for name, r in doc["policies"].items():
        t.add_row(name, f"{r['goodput']:.4f}",
                  f"{r['vs_ceiling_pp']:+.2f} ±{r['vs_ceiling_pp_stdev_over_seeds']:.2f} pp",
                  f"{_s(r['recovery_p50_s'])} / {_s(r['recovery_p99_s'])}",
                  f"{_s(r['resume_p50_s'])} / {_s(r['resume_p99_s'])}",
                  f"{r['accelerator_hours_lost']:.1f}", f"${r['cost']:,.0f}",
                  f"${r['cost_per_useful_accelerator_hour']:.3f}" if r["cost_per_useful_accelerator_hour"] else "-",
                  f"{r['training_share_of_wall_time']:.1%}",
                  _s(r["mean_interval_s"]))
    taus = [v for d in doc["ceiling_detail"]["per_seed"].values() for v in d["intervals_s"].values()]
    t.add_row("ceiling (analytic)", f"{top:.4f}", "", "0s", "boot", "", "", "", "",
              f"{_s(min(taus))}-{_s(max(taus))}")
    return t


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

    names_ = list(doc["goodput"])
    colours = ["#1f77b4" if n.startswith("respawn") else "#2ca02c" if n == "ideal" else "#999999" for n in names_]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    panels = ((left, [doc["goodput"][n] for n in names_], "goodput (useful / paid GPU time)", "{:.3f}"),
              (right, [doc["policies"][n]["training_share_of_wall_time"] for n in names_],
               "training share of wall time (useful / job-time)", "{:.1%}"))
    for ax, values, label, fmt in panels:
        bars = ax.bar(names_, values, color=colours)
        for bar, v in zip(bars, values, strict=True):
            ax.annotate(fmt.format(v), (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(label)
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    left.axhline(doc["ceiling"], color="#d62728", linestyle="--", label=f"ceiling (analytic) {doc['ceiling']:.3f}")
    low = min([*doc["goodput"].values(), doc["ceiling"]])
    left.set_ylim(max(0.0, low - 0.05), min(1.0, max([*doc["goodput"].values(), doc["ceiling"]]) + 0.02))
    left.legend(loc="lower right", fontsize=8)
    shares = [doc["policies"][n]["training_share_of_wall_time"] for n in names_]
    right.set_ylim(max(0.0, min(shares) - 0.1), min(1.0, max(shares) + 0.03))
    p = doc["parameters"]
    fig.suptitle(f"respawn fleet simulator: {p['days']:g} days x {len(p['seeds_run'])} seeds, {p['jobs']} jobs, "
                 f"{p['zones']} zones")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console  # noqa: PLC0415

    p, args = parse(argv)
    console = Console(width=160)
    doc = simulate(p, workers=args.workers, skip_ticks=not args.no_skip, verify_skips=args.verify_skips)
    console.print(table(doc))
    console.print(f"ceiling: ideal recovery (boot only) in the best zone available, per-zone optimal interval "
                  f"(exact for this model; the first-order Young/Daly formula gives "
                  f"{doc['ceiling_detail']['young_daly_goodput']:.4f}); ± is the standard deviation over seeds of "
                  f"the per-seed difference")
    n_seeds = len(doc["parameters"]["seeds_run"])
    for name, r in doc["policies"].items():
        if "respawn_ahead_pp" in r:
            console.print(f"respawn vs {name}: {r['respawn_ahead_pp']:+.2f} pp goodput, ahead in "
                          f"{r['respawn_ahead_in_seeds']} of {n_seeds} seeds")
    used = doc["interval_advice"]
    for name, n in used["from_controller_metadata"].items():
        m = used["computed_by_the_sim"][name]
        note = "" if not m else (f"; {m} VMs had no {INTERVAL_HINT} in metadata: advice computed by the sim "
                                 f"(Young/Daly {_s(doc['young_daly_interval_s_sim'])})")
        console.print(f"{name}: {n} VMs took the controller's interval{note}")
    for name, r in doc["policies"].items():
        if r["errors"]:
            console.print(f"[yellow]{name}: {r['counters']['pass_errors']} pass errors (not capacity), "
                          f"e.g. {r['errors'][0]}")
        if "controller_ledger_goodput" in r:
            g = r["controller_ledger_goodput"]
            console.print(f"{name}: the controller's own ledger says goodput "
                          f"{'unavailable' if g is None else f'{g:.4f}'} (the sim measures {r['goodput']:.4f})")
    console.print(f"wall time {doc['wall_s']:.1f} s ({doc['machine']})")
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
