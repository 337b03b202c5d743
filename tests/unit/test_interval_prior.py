"""The checkpoint interval after a run's first few losses (controller.core.ledger.lifetime), judged
in the simulator's own model of a Spot zone (sim.model.zone_goodput: Weibull lifetimes of shape
0.8, its boots, notice and a 120 s save): the goodput a job gives up against the best fixed
interval for that zone, on average over the lifetimes its losses could have had.

Advice is as sim/advice.py gives it: the zone's median lifetime times a lognormal factor
(sigma 0.3), never the mean (1.79x the median at this shape)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from controller.core import ledger
from sim.model import Params, Zone, best_interval, zone_goodput

P = Params()
DRAWS = 80
# The distance the advised interval may stay from the best fixed one, in goodput points, after
# 1, 2 and 5 losses. The rule before the prior (M = the run's own mean from the first loss) gave
# up 3.5-8.2 points after one loss at these medians.
WITHIN_POINTS = 1.0


def zone(median_h: float) -> Zone:
    median = median_h * 3600
    scale = median / math.log(2) ** (1 / P.weibull_k)
    return Zone("z", median, scale, scale * math.gamma(1 + 1 / P.weibull_k), 0.0, 0.0, ())


class Goodput:
    """G(τ) of one zone, by 10 s steps of τ (the model is smooth at that scale)."""

    def __init__(self, z: Zone) -> None:
        self.z, self.cache = z, {}
        self.best_tau, self.best = best_interval(z, P)

    def __call__(self, tau: float) -> float:
        key = round(tau, -1)
        if key not in self.cache:
            self.cache[key] = zone_goodput(self.z, key, P)
        return self.cache[key]


def given_up(z: Zone, losses: int, advice_factor: float = 1.0, seed: int = 1) -> tuple[float, float]:
    """Mean goodput points given up against the best fixed interval after ``losses`` losses: the
    advised interval's, and the run's own mean's (the rule before the prior)."""
    rng = random.Random(f"{seed}-{z.lifetime_median_s}-{losses}-{advice_factor}")
    g = Goodput(z)
    advised, own = [], []
    for _ in range(DRAWS):
        uptime = advice_factor * z.lifetime_median_s * math.exp(rng.gauss(0.0, 0.3))
        # The run's RUNNING time: each VM's lifetime less its boot (a VM lost booting ran none).
        ran = sum(max(0.0, z.lifetime(1.0 - rng.random(), P.weibull_k) - rng.uniform(*P.boot_s))
                  for _ in range(losses))
        book = ledger.Ledger(totals=ledger.Totals(running_s=ran, platform_losses=losses))
        tau = ledger.checkpoint_every(book, P.checkpoint_cost_s, uptime)
        assert tau is not None or ran == 0
        advised.append(g.best - g(tau if tau is not None else ledger.MIN_INTERVAL_S))
        raw = min(ledger.MAX_INTERVAL_S, max(ledger.MIN_INTERVAL_S, math.sqrt(2 * P.checkpoint_cost_s * ran / losses)))
        own.append(g.best - g(raw))
    return 100 * statistics.mean(advised), 100 * statistics.mean(own)


@pytest.mark.parametrize("median_h", [0.5, 3.0, 8.0])
@pytest.mark.parametrize("losses", [1, 2, 5])
def test_the_interval_after_few_losses_stays_near_the_best_fixed_interval(median_h, losses):
    advised, own = given_up(zone(median_h), losses)
    assert advised <= WITHIN_POINTS, f"{advised:.2f} points given up after {losses} losses at a {median_h} h median"
    if losses == 1:  # the bound has teeth: the run's own mean alone misses it by far
        assert own >= advised + 1.0, own


def test_advice_far_too_long_is_set_aside_by_the_run_s_own_losses():
    """Advice 1,000x the zone's lifetime: two losses' weight would hold the interval near its 6 h
    ceiling for hundreds of losses; the run's losses set it aside at the third. Advice 30x too
    long costs what trusting it costs (the price of the prior where the advice is wrong), and is
    set aside within a few more."""
    advised, own = given_up(zone(0.5), 3, advice_factor=1000.0)
    assert advised <= own + 0.25, (advised, own)
    advised, own = given_up(zone(0.5), 5, advice_factor=30.0)
    assert advised <= own + 1.5, (advised, own)
    book = ledger.Ledger(totals=ledger.Totals(running_s=3 * 1800.0, platform_losses=3))
    known = ledger.lifetime(book, 30 * 86400.0)
    assert known.set_aside and known.prior_s is None and known.mean_s == 1800.0
    two = ledger.lifetime(book.model_copy(update={"totals": ledger.Totals(running_s=3600.0, platform_losses=2)}),
                          30 * 86400.0)
    assert not two.set_aside and two.prior_s == 30 * 86400.0  # two losses never outweigh the advice


def test_the_estimate_says_how_sure_it_is_and_what_it_rests_on():
    before = ledger.lifetime(ledger.Ledger(), 7200.0)
    assert (before.mean_s, before.losses, before.prior_s, before.set_aside) == (7200.0, 0, 7200.0, False)
    assert before.low_s < 7200.0 < before.high_s
    book = ledger.Ledger(totals=ledger.Totals(running_s=3600.0, platform_losses=1))
    after = ledger.lifetime(book, 7200.0)
    assert after.mean_s == (3600.0 + 2 * 7200.0) / 3 and after.losses == 1
    many = ledger.lifetime(ledger.Ledger(totals=ledger.Totals(running_s=3600.0 * 40, platform_losses=40)), 7200.0)
    # More losses, a narrower interval, and the estimate the run's own.
    assert many.high_s / many.low_s < after.high_s / after.low_s < before.high_s / before.low_s
    assert abs(many.mean_s - 3600.0) < abs(after.mean_s - 3600.0)
    alone = ledger.lifetime(book, None)
    assert (alone.mean_s, alone.prior_s) == (3600.0, None)
    assert ledger.lifetime(ledger.Ledger(), None) is None
