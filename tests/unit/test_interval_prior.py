"""The checkpoint interval after a run's first few losses (controller.core.ledger.lifetime), judged
in the simulator's own model of a Spot zone (sim/interval.py): the goodput a job gives up
against the best fixed interval for that zone, on average over the lifetimes its losses could
have had. Figures: ``python -m sim.interval``."""

from __future__ import annotations

import pytest

from controller.core import ledger
from sim.interval import given_up, zone

# The distance the advised interval may stay from the best fixed one, in goodput points, after
# 1, 2 and 5 losses. The rule before the prior (M = the run's own mean from the first loss) gave
# up 1.9-9.5 points after one loss at these medians (python -m sim.interval).
WITHIN_POINTS = 1.0


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
