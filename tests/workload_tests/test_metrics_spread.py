"""The sampling spread of a window's P90 (an order-statistic interval)."""

from __future__ import annotations

import numpy as np

from tuner.workload.metrics import RequestRecord, aggregate, p90_spread


def _records(ttfts):
    return [RequestRecord(session_id=i, turn=0, start_s=0.0, input_tokens=10, output_tokens=11, ttft_s=t,
                          end_s=t + 1.0) for i, t in enumerate(ttfts)]


def test_the_spread_brackets_the_p90_and_narrows_with_more_requests():
    rng = np.random.default_rng(3)
    small = rng.lognormal(-1.5, 0.6, 100)
    large = rng.lognormal(-1.5, 0.6, 10000)
    lo_s, hi_s = p90_spread(small)
    lo_l, hi_l = p90_spread(large)
    assert lo_s <= np.percentile(small, 90) <= hi_s
    assert lo_l <= np.percentile(large, 90) <= hi_l
    # a hundred times the requests: about a tenth of the width
    assert (hi_l - lo_l) < (hi_s - lo_s) / 5


def test_the_interval_covers_the_true_p90_about_nine_times_in_ten():
    rng = np.random.default_rng(7)
    true_p90 = float(np.exp(-1.5 + 0.6 * 1.2815515655446004))  # lognormal's 90th percentile
    covered = 0
    for _ in range(400):
        lo, hi = p90_spread(rng.lognormal(-1.5, 0.6, 100))
        covered += lo <= true_p90 <= hi
    assert 0.85 <= covered / 400 <= 0.97


def test_a_p90_at_the_edge_of_a_few_stalled_requests_is_fragile():
    # 9 of 100 requests caught in a stall: the P90 is still a fast one, by one request
    stalled = [0.1] * 91 + [1.0] * 9
    assert np.percentile(stalled, 90) < 0.2
    lo, hi = p90_spread(stalled)
    assert lo == 0.1 and hi > 0.5  # one more stalled request in the window and P90 is a slow one
    assert p90_spread([0.1] * 97 + [1.0] * 3) == (0.1, 0.1)  # far from the edge: no spread


def test_aggregate_records_the_spread_and_leaves_it_out_below_ten_requests():
    m = aggregate(_records([0.1 + 0.01 * i for i in range(40)]), users=4, duration_s=10)
    lo, hi = m.extra["p90_spread"]["ttft_s"]
    assert lo <= m.p90_ttft_s <= hi
    assert "tpot_s" in m.extra["p90_spread"]
    assert "p90_spread" not in aggregate(_records([0.1] * 5), users=1, duration_s=10).extra


def test_the_spread_is_reproducible():
    v = list(np.random.default_rng(1).lognormal(0, 1, 200))
    assert p90_spread(v) == p90_spread(v)


def test_counted_in_window_takes_starts_and_the_warm_ups_still_waiting():
    from tuner.workload.metrics import counted_in_window

    w = (10.0, 20.0)
    assert counted_in_window(10.0, 10.5, w) and counted_in_window(19.9, None, w)
    assert not counted_in_window(20.0, 20.1, w)  # starts after the window
    assert counted_in_window(5.0, 12.0, w)  # first token after the window opened
    assert counted_in_window(5.0, 10.0, w)
    assert counted_in_window(5.0, None, w)  # still waiting
    assert not counted_in_window(5.0, 9.9, w)  # served (or failed) in the warm-up


def test_a_verdict_is_marginal_where_a_limit_lies_inside_a_p90_interval():
    from tuner.workload.metrics import verdict_marginal

    limits = (1.0, 0.025)
    spread = {"ttft_s": (0.5, 0.7), "tpot_s": (0.022, 0.026)}
    # a pass whose TPOT interval reaches past its limit could be a miss
    assert verdict_marginal(True, (0.6, 0.024), spread, limits) is True
    # a pass whose intervals both stay under the limits is decided
    assert verdict_marginal(True, (0.6, 0.020), {"ttft_s": (0.5, 0.7), "tpot_s": (0.019, 0.021)}, limits) is False
    # a miss over TPOT alone whose interval reaches back under its limit could be a pass ...
    assert verdict_marginal(False, (0.6, 0.0255), spread, limits) is True
    # ... but not one that is also over TTFT with an interval wholly above it
    assert verdict_marginal(False, (1.5, 0.0255), {"ttft_s": (1.3, 1.8), "tpot_s": (0.022, 0.026)}, limits) is False
    # a miss of an invalid window is no noise, and a window without intervals is unknown
    assert verdict_marginal(False, (0.6, 0.0255), spread, limits, valid=False) is False
    assert verdict_marginal(True, (0.6, 0.024), None, limits) is None
    assert verdict_marginal(True, (0.6, 0.024), {}, limits) is None
