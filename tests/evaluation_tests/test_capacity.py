import dataclasses
import math

import pytest

from tuner.evaluation.capacity import CapacitySearch, slo_margin
from tuner.vocabulary import Bisection


def run(true_capacity, **kw):
    s = CapacitySearch(**{"start_users": 16, "max_users": 256, "resolution_users": 2, **kw})
    while not s.done:
        u = s.next_users()
        s.record(u, u <= true_capacity)
    return s


@pytest.mark.parametrize("true_capacity", [1, 5, 16, 17, 37, 50, 99, 200, 255])
def test_finds_capacity_within_resolution(true_capacity):
    s = run(true_capacity)
    assert s.capacity_users <= true_capacity
    assert true_capacity - s.capacity_users < 2
    assert len(s.steps) <= 12


def test_zero_when_even_one_user_misses():
    s = run(0)
    assert s.capacity_users == 0
    assert s.steps[-1] == (1, False)


def test_stops_at_max_users():
    s = run(10_000)
    assert s.capacity_users == 256
    assert [u for u, _ in s.steps] == [16, 32, 64, 128, 256]


def test_gallops_then_bisects():
    s = run(50)
    users = [u for u, _ in s.steps]
    assert users[:3] == [16, 32, 64]  # gallop
    assert all(32 < u < 64 for u in users[3:])  # bisect inside the bracket


def test_upper_bound_shrinks_after_a_miss():
    s = CapacitySearch(start_users=16, max_users=256)
    assert s.upper_bound() == 256
    s.record(16, True)
    s.record(32, False)
    assert s.upper_bound() == 31 and s.next_users() == 24


def guided(guess, true_capacity, **kw):
    s = CapacitySearch(**{"start_users": guess, "max_users": 256, "resolution_users": 8, "guided": True, **kw})
    while not s.done:
        u = s.next_users()
        s.record(u, u <= true_capacity)
    return s


@pytest.mark.parametrize("guess", [8, 24, 40])
def test_a_guided_search_brackets_a_right_guess_in_two_load_points(guess):
    s = guided(guess, guess)
    assert s.steps == [(guess, True), (guess + 8, False)]
    assert s.capacity_users == guess


def test_a_guided_search_steps_down_by_the_resolution_when_the_guess_misses():
    s = guided(24, 16)
    assert s.steps == [(24, False), (16, True)]


@pytest.mark.parametrize("guess", [1, 8, 30, 64, 200])
@pytest.mark.parametrize("true_capacity", [0, 3, 16, 37, 99, 255])
def test_a_guided_search_finds_capacity_within_resolution_from_any_guess(guess, true_capacity):
    s = guided(guess, true_capacity)
    assert s.capacity_users <= true_capacity
    assert true_capacity - s.capacity_users < 8 or s.capacity_users == 256
    assert len(s.steps) <= 12
    # stepping out from the guess, the steps grow (8, 16, 32...) until the bracket is found
    out = []
    for u, passed in s.steps:
        if out and passed != s.steps[0][1]:
            break
        out.append(u)
    if out[-1] in (1, 256):  # the last step was clamped at a bound
        out = out[:-1]
    gaps = [abs(b - a) for a, b in zip(out, out[1:])]
    assert gaps == [8 * 2 ** i for i in range(len(gaps))]


def test_a_guided_search_that_fails_everywhere_ends_at_the_smallest_load():
    s = guided(24, 0)
    assert s.capacity_users == 0 and s.steps[-1] == (1, False)


def test_for_study_takes_a_prediction_as_a_guided_start(tmp_path):
    from tests.study_tests.fakes import tiny_study

    study = tiny_study(tmp_path, max_users=64)
    plain = CapacitySearch.for_study(study)
    assert (plain.next_users(), plain.guided) == (4, False)
    s = CapacitySearch.for_study(study, predicted_users=500)  # clamped to the study's max_users
    assert (s.next_users(), s.guided) == (64, True)


# ---- marginal passes are confirmed -------------------------------------------------------------

def _point(users: int, p90_tpot_s: float, tpot_spread=None, requests=100):
    from tuner.workload.metrics import LoadPointMetrics

    extra = {"p90_spread": {"tpot_s": list(tpot_spread)}} if tpot_spread else {}
    return LoadPointMetrics(users=users, requests=requests, errors=0, duration_s=40, p50_ttft_s=0.1, p90_ttft_s=0.2,
                            p99_ttft_s=0.3, p50_tpot_s=0.02, p90_tpot_s=p90_tpot_s, p99_tpot_s=0.03, p50_itl_s=None,
                            p90_itl_s=None, p99_itl_s=None, p90_e2e_s=None, throughput_tokens_per_s=1.0,
                            input_throughput_tokens_per_s=1.0, prefix_cache_hit_rate=None, extra=extra)


def _confirming(start_users=24, **kw):
    return CapacitySearch(start_users=start_users, max_users=64, resolution_users=8, p90_ttft_s=1.5, p90_tpot_s=0.025,
                          guided=True, confirm_marginal=True, **kw)


def test_a_pass_whose_spread_reaches_past_the_limit_is_marginal_and_one_clear_of_it_is_not():
    s = _confirming()
    assert s.marginal(_point(24, 0.0249, (0.0236, 0.0262)))  # trial 7's 24.9 ms: the spread crosses 25
    assert not s.marginal(_point(16, 0.0231, (0.0222, 0.0240)))
    assert not s.marginal(_point(24, 0.0249))  # no spread recorded: nothing to judge it by


def test_a_marginal_pass_is_measured_again_and_a_second_miss_takes_it_away():
    s = _confirming()
    assert s.next_users() == 24
    s.record(24, True, marginal=True)
    assert s.next_users() == 24 and s.capacity_users == 0  # not counted until confirmed
    s.record(24, False)  # the second window missed
    assert s.lowest_fail == 24 and s.next_users() == 16
    s.record(16, True)
    assert s.done and s.capacity_users == 16


def test_a_confirmed_marginal_pass_counts_once_and_the_search_goes_on():
    s = _confirming()
    s.record(24, True, marginal=True)
    s.record(24, True, marginal=True)  # a second marginal pass is a pass: one confirmation is enough
    assert s.capacity_users == 24 and s.next_users() == 32  # stepped up by the resolution, not grown twice
    s.record(32, False)
    assert s.done and s.capacity_users == 24
    assert s.steps == [(24, True), (24, True), (32, False)]


def test_without_confirm_marginal_the_search_is_unchanged():
    a = CapacitySearch(start_users=24, max_users=64, resolution_users=8, guided=True)
    a.record(24, True, marginal=True)
    assert a.capacity_users == 24 and a.next_users() == 32


def test_for_study_reads_confirm_marginal(tmp_path):
    from types import SimpleNamespace

    from tuner.config.schema import CapacitySpec

    study = SimpleNamespace(capacity=CapacitySpec(confirm_marginal=True),
                            slo=SimpleNamespace(p90_ttft_s=1.5, p90_tpot_s=0.025))
    assert CapacitySearch.for_study(study).confirm_marginal
    assert not CapacitySpec().confirm_marginal


def test_a_miss_the_noise_could_turn_is_marginal_and_a_clear_one_is_not():
    s = _confirming()
    assert s.marginal(_point(16, 0.02513, (0.0247, 0.0277)))  # trial 14's 16 users: 25.13 ms, 24.7-27.7
    assert not s.marginal(_point(24, 0.0294, (0.0262, 0.0318)))  # trial 0's 24 users: the whole interval over
    assert not s.marginal(_point(16, 0.02513))  # no spread recorded


def _record(s, m):
    s.record(m.users, s.meets(m), marginal=s.marginal(m), point=m)


def test_a_marginal_miss_is_measured_again_and_the_two_windows_decide_together():
    """Trial 14 of the H200 study: 16 users missed by 0.13 ms on 68 requests, its interval
    reaching under the limit. A second window at 23.9 ms on 70 requests pools to 24.5 ms: 16 met."""
    s = _confirming(start_users=16)
    _record(s, _point(16, 0.02513, (0.0247, 0.0277), requests=68))
    assert s.next_users() == 16 and s.lowest_fail is None and s.capacity_users == 0
    _record(s, _point(16, 0.0239, (0.0228, 0.0252), requests=70))
    assert s.capacity_users == 16 and s.lowest_fail is None and s.next_users() == 24


def test_pooled_windows_take_a_marginal_pass_away_when_together_they_miss():
    """Trial 15: 24 users passed at 24.0 ms (107 requests, interval to 27.0), the second window
    missed at 26.55 ms (101): together 25.2 ms, over the 25 ms limit; a second window that passes
    does not save a first one that missed by more than it passed."""
    s = _confirming()
    _record(s, _point(24, 0.0240, (0.0229, 0.0270), requests=107))
    _record(s, _point(24, 0.02655, (0.0259, 0.0277), requests=101))
    assert s.lowest_fail == 24 and s.capacity_users == 0 and s.next_users() == 16
    t = _confirming()
    _record(t, _point(24, 0.0262, (0.0246, 0.0281)))  # missed, marginal
    _record(t, _point(24, 0.0245))  # passed, but (26.2 + 24.5) / 2 = 25.35 ms
    assert t.lowest_fail == 24 and t.capacity_users == 0
    assert t.pooled_meets(_point(24, 0.0262), _point(24, 0.0236))  # 24.9 ms together: met
    assert not t.pooled_meets(_point(24, 0.0200), dataclasses.replace(_point(24, 0.0200), valid=False))


# ---- interpolating bisection -------------------------------------------------------------------

def _linear_world(true_capacity: float, slope: float = 0.02):
    """P90 TPOT rising with users, crossing the 50 ms limit at ``true_capacity`` users."""
    return lambda users: _point(users, 0.05 * math.exp(slope * (users - true_capacity)))


def _search(world, bisect, **kw):
    s = CapacitySearch(**{"start_users": 16, "max_users": 256, "resolution_users": 4, "p90_ttft_s": 30.0,
                          "p90_tpot_s": 0.05, "bisect": bisect, **kw})
    while not s.done:
        _record(s, world(s.next_users()))
    return s


def test_slo_margin_is_the_binding_log_ratio():
    assert slo_margin((15.0, 0.05), 30.0, 0.05) == pytest.approx(0.0)
    assert slo_margin((60.0, 0.025), 30.0, 0.05) == pytest.approx(math.log(2))
    assert slo_margin((15.0, 0.025), 30.0, 0.05) == pytest.approx(math.log(0.5))
    assert slo_margin((None, 0.025), 30.0, 0.05) is None and slo_margin(None, 30.0, 0.05) is None


@pytest.mark.parametrize("true_capacity", [37.5, 41.2, 45.0, 50.7, 59.9, 71.3, 100.5, 150.2, 200.8])
def test_interpolation_finds_the_same_capacity_in_fewer_load_points(true_capacity):
    world = _linear_world(true_capacity)
    mid = _search(world, Bisection.MIDPOINT)
    interp = _search(world, Bisection.INTERPOLATE)
    for s in (mid, interp):
        assert s.capacity_users <= true_capacity < s.lowest_fail and s.lowest_fail - s.capacity_users <= 4
    assert len(interp.steps) <= len(mid.steps)
    assert [u for u, _ in interp.steps][:3] == [16, 32, 64]  # the gallop is the same


def test_interpolation_saves_load_points_over_many_capacities():
    capacities = [17 + 3.7 * i for i in range(60)]
    mid = sum(len(_search(_linear_world(c), Bisection.MIDPOINT).steps) for c in capacities)
    interp = sum(len(_search(_linear_world(c), Bisection.INTERPOLATE).steps) for c in capacities)
    assert interp < 0.9 * mid


def test_interpolation_probes_near_the_crossing_and_keeps_the_resolution_from_the_ends():
    s = CapacitySearch(start_users=16, max_users=256, resolution_users=4, p90_ttft_s=30.0, p90_tpot_s=0.05)
    _record(s, _point(16, 0.020))
    _record(s, _point(32, 0.040))
    _record(s, _point(64, 0.080))  # bracket (32, 64); log margins -0.223 and +0.470: crossing at 42.3
    assert s.next_users() == 42
    _record(s, _point(42, 0.049))  # passed just under: the crossing is next to it, so step out by the resolution
    assert s.next_users() == 46


def test_without_p90s_interpolation_is_the_midpoint_search():
    """Verdicts alone (a replayed table) or an end with an invalid window: the midpoint."""
    a = CapacitySearch(start_users=16, max_users=256)
    b = CapacitySearch(start_users=16, max_users=256, bisect=Bisection.MIDPOINT)
    for s in (a, b):
        while not s.done:
            u = s.next_users()
            s.record(u, u <= 50)
    assert a.bisect is Bisection.INTERPOLATE and a.steps == b.steps
    s = CapacitySearch(start_users=16, max_users=256, resolution_users=4, p90_ttft_s=30.0, p90_tpot_s=0.05)
    _record(s, _point(16, 0.020))
    _record(s, _point(32, 0.040))
    _record(s, dataclasses.replace(_point(64, 0.080), valid=False, invalid_reason="errors"))
    assert s.next_users() == 48


def test_a_bent_curve_falls_back_to_halving():
    """TTFT that jumps at a knee: the line between the bracket's ends keeps landing on one side;
    after three such steps the search halves, and it still ends within the resolution."""
    def knee(users):
        m = _point(users, 0.02)
        return dataclasses.replace(m, p90_ttft_s=1.0 if users <= 150 else 1000.0)
    s = _search(knee, Bisection.INTERPOLATE, resolution_users=2)
    assert s.capacity_users <= 150 < s.lowest_fail and s.lowest_fail - s.capacity_users <= 2
    mid = _search(knee, Bisection.MIDPOINT, resolution_users=2)
    assert len(s.steps) <= len(mid.steps) + 3


def test_for_study_reads_bisect():
    from types import SimpleNamespace

    from tuner.config.schema import CapacitySpec

    slo = SimpleNamespace(p90_ttft_s=1.5, p90_tpot_s=0.025)
    assert CapacitySearch.for_study(SimpleNamespace(capacity=CapacitySpec(), slo=slo)).bisect is Bisection.INTERPOLATE
    study = SimpleNamespace(capacity=CapacitySpec(bisect="midpoint"), slo=slo)
    assert CapacitySearch.for_study(study).bisect is Bisection.MIDPOINT


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_hostile_p90s_leave_the_search_finishing_within_the_resolution(bad):
    """A window reporting a NaN, infinite, zero or negative P90 above 40 users: no margin, or an
    extreme one, and the search still ends with a bracket no wider than the resolution."""
    def world(users):
        m = _point(users, 0.05 * math.exp(0.02 * (users - 45.0)))
        return dataclasses.replace(m, p90_ttft_s=bad) if users > 40 else m
    s = _search(world, Bisection.INTERPOLATE)
    assert s.done and s.lowest_fail - s.capacity_users <= 4 and len(s.steps) <= 12
