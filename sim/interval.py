"""The checkpoint interval after a run's first few losses, in the simulator's model of a Spot zone.

``python -m sim.interval`` prints, for zones whose median Spot lifetime is 0.5 to 8 hours, the
mean goodput points a job gives up against the best fixed interval for its zone
(``sim.model.zone_goodput``: Weibull lifetimes of shape 0.8, its boots, notice and save) after 1,
2 and 5 losses: with respawn's interval (``controller.core.ledger.checkpoint_every``: the zone's
advised uptime weighed as two losses beside the run's own) and with the run's own mean alone
(the rule before the prior). Advice is as sim/advice.py gives it: the zone's *median* lifetime
times a lognormal factor (sigma 0.3), optionally ``--advice-factor`` times off.
tests/unit/test_interval_prior.py holds respawn's interval to these figures.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from controller.core import ledger
from sim.model import Params, Zone, best_interval, zone_goodput

P = Params()
DRAWS = 80
MEDIANS_H = (0.5, 1.0, 3.0, 5.0, 8.0)
LOSSES = (1, 2, 5)


def zone(median_h: float, p: Params = P) -> Zone:
    return Zone.weibull("z", median_h * 3600, p.weibull_k)


class Goodput:
    """G(τ) of one zone, by 10 s steps of τ (the model is smooth at that scale)."""

    def __init__(self, z: Zone, p: Params = P) -> None:
        self.z, self.p, self.cache = z, p, {}
        self.best_tau, self.best = best_interval(z, p)

    def __call__(self, tau: float) -> float:
        key = round(tau, -1)
        if key not in self.cache:
            self.cache[key] = zone_goodput(self.z, key, self.p)
        return self.cache[key]


def _bounded(tau: float) -> float:
    return min(ledger.MAX_INTERVAL_S, max(ledger.MIN_INTERVAL_S, tau))


def given_up(z: Zone, losses: int, advice_factor: float = 1.0, seed: int = 1,
             draws: int = DRAWS, p: Params = P) -> tuple[float, float]:
    """Mean goodput points given up against the best fixed interval after ``losses`` losses:
    respawn's interval's, and the run's own mean's."""
    rng = random.Random(f"{seed}-{z.lifetime_median_s}-{losses}-{advice_factor}")
    g = Goodput(z, p)
    advised, own = [], []
    for _ in range(draws):
        uptime = advice_factor * z.lifetime_median_s * math.exp(rng.gauss(0.0, 0.3))
        # The run's RUNNING time: each VM's lifetime less its boot (a VM lost booting ran none).
        ran = sum(max(0.0, z.lifetime(1.0 - rng.random(), p.weibull_k) - rng.uniform(*p.boot_s))
                  for _ in range(losses))
        book = ledger.Ledger(totals=ledger.Totals(running_s=ran, platform_losses=losses))
        tau = ledger.checkpoint_every(book, p.checkpoint_cost_s, uptime)
        advised.append(g.best - g(tau if tau is not None else ledger.MIN_INTERVAL_S))
        own.append(g.best - g(_bounded(math.sqrt(2 * p.checkpoint_cost_s * ran / losses))))
    return 100 * statistics.mean(advised), 100 * statistics.mean(own)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.interval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--advice-factor", type=float, default=1.0, help="advice this many times the true median")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"goodput points given up against the best fixed interval (mean of {DRAWS} runs; "
          f"advice x{args.advice_factor:g}, seed {args.seed}): respawn's interval / the run's own mean")
    print("median lifetime  " + "  ".join(f"after {n} loss{'es' if n > 1 else '  '}" for n in LOSSES))
    for median in MEDIANS_H:
        cells = [given_up(zone(median), n, args.advice_factor, args.seed) for n in LOSSES]
        print(f"{median:>13.1f} h  " + "  ".join(f"{a:5.2f} / {o:5.2f}" for a, o in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
