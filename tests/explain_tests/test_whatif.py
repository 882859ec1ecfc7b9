"""What-if without new trials: capacities at other targets from stored load points, checked against
an independent recomputation from the raw measurement rows, and never extrapolated."""

import sqlite3

import pytest

from tests.conftest import run_cli
from tests.report_tests.studydb import run_study
from tuner.errors import ConfigError
from tuner.explain import LoadPoint, parse_slo, what_if
from tuner.explain.whatif import Coverage
from tuner.lifecycle import TrialStatus
from tuner.study.summary import study_summary, what_if_summary


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("whatif")
    storage, _ = run_study(tmp, name="wi", trials=8)
    return tmp, storage


def _raw(db_path):
    """trial -> [(users, p90 TTFT, p90 TPOT, valid)] straight from tuner_measurements."""
    con = sqlite3.connect(db_path)
    rows = con.execute("SELECT trial_number, users, p90_ttft_s, p90_tpot_s, valid FROM tuner_measurements "
                       "WHERE study_name = 'wi'").fetchall()
    con.close()
    out: dict[int, list] = {}
    for n, u, ttft, tpot, valid in rows:
        out.setdefault(n, []).append((u, ttft, tpot, bool(valid)))
    return out


def _recompute(points, ttft, tpot):
    """Independent: (largest users with every smaller stored count meeting, smallest count that misses)."""
    ok_by_users: dict[int, bool] = {}
    for u, a, b, valid in points:
        ok = valid and a is not None and b is not None and a <= ttft and b <= tpot
        ok_by_users[u] = ok_by_users.get(u, True) and ok
    lower = upper = None
    for u in sorted(ok_by_users):
        if not ok_by_users[u]:
            upper = u
            break
        lower = u
    return lower, upper


@pytest.mark.parametrize("ttft,tpot", [(30.0, 0.050), (10.0, 0.060), (5.0, 0.030), (60.0, 0.100), (2.0, 0.020),
                                       (8.0, 1.0)])
def test_what_if_matches_a_recomputation_from_the_raw_load_points(study, ttft, tpot):
    tmp, storage = study
    raw = _raw(tmp / "tuner.db")
    w = what_if_summary(study_summary(storage, "wi"), ttft, tpot)
    assert w["slo"] == {"p90_ttft_s": ttft, "p90_tpot_s": tpot}
    checked = 0
    for r in w["trials"]:
        pts = raw.get(r["trial"], [])
        if not pts:
            assert r["coverage"] == "no_points" and r["capacity_users"] is None
            continue
        lower, upper = _recompute(pts, ttft, tpot)
        if lower is None:
            assert r["capacity_users"] is None and r["upper_bound_users"] == upper and r["coverage"] == "fewer_than"
        else:
            assert (r["capacity_users"], r["upper_bound_users"]) == (lower, upper)
            assert r["coverage"] == ("at_least" if upper is None else "exact" if upper - lower <= 4 else "bracketed")
        checked += 1
    assert checked >= 5
    best = max((r for r in w["trials"] if r["capacity_users"] is not None), key=lambda r: r["capacity_users"],
               default=None)
    assert (w["best"] or {}).get("capacity_users") == (best or {}).get("capacity_users")


def test_at_the_studys_own_targets_the_what_if_is_the_stored_capacity(study):
    _, storage = study
    s = study_summary(storage, "wi")
    w = what_if_summary(s, s["slo"]["p90_ttft_s"], s["slo"]["p90_tpot_s"])
    for t, r in zip(s["trials"], w["trials"]):
        if t["status"] == TrialStatus.COMPLETE and t["measurements"]:
            assert r["capacity_users"] == t["capacity_users"] and r["coverage"] in ("exact", "at_least")


def _pts(*spec):
    return [LoadPoint(users=u, p90_ttft_s=a, p90_tpot_s=b, valid=v) for u, a, b, v in spec]


def test_coverage_is_marked_instead_of_extrapolating():
    pts = _pts((16, 1.0, 0.02, True), (32, 2.0, 0.03, True), (64, 9.0, 0.06, True))
    w = what_if(1, pts, 5.0, 0.05, resolution_users=4)
    assert (w.capacity_users, w.upper_bound_users, w.coverage) == (32, 64, Coverage.BRACKETED)
    assert w.text.startswith("between 32 and 63 users") and w.short == "32-63"
    w = what_if(1, pts, 20.0, 0.10)
    assert (w.capacity_users, w.upper_bound_users, w.coverage) == (64, None, Coverage.AT_LEAST)
    assert "none above 64 was measured" in w.text and w.short == ">= 64"
    w = what_if(1, pts, 0.5, 0.10)
    assert (w.capacity_users, w.upper_bound_users, w.coverage) == (None, 16, Coverage.FEWER_THAN)
    assert w.short == "< 16"
    dense = _pts((16, 1.0, 0.02, True), (20, 1.5, 0.04, True), (24, 4.0, 0.05, True))
    w = what_if(1, dense, 2.0, 0.05, resolution_users=4)
    assert (w.capacity_users, w.upper_bound_users, w.coverage) == (20, 24, Coverage.EXACT) and w.short == "20"
    assert what_if(1, [], 1, 1).coverage is Coverage.NO_POINTS


def test_an_invalid_or_non_monotone_point_is_a_miss_and_the_first_miss_bounds():
    pts = _pts((16, 1.0, 0.02, True), (32, 1.0, 0.02, False), (64, 1.0, 0.02, True))
    w = what_if(1, pts, 5.0, 0.05, resolution_users=64)
    assert (w.capacity_users, w.upper_bound_users, w.non_monotone) == (16, 32, True)
    assert "meets them again" in w.text
    # a repeated user count is decided by its windows together: P90s averaged (weighted by requests)
    rep = _pts((16, 1.0, 0.02, True), (16, 9.5, 0.02, True))  # 5.25 s together, over 5
    assert what_if(1, rep, 5.0, 0.05).coverage is Coverage.FEWER_THAN
    rep = _pts((16, 1.0, 0.02, True), (16, 8.0, 0.02, True))  # 4.5 s together
    assert what_if(1, rep, 5.0, 0.05).capacity_users == 16
    heavy = [LoadPoint(users=16, p90_ttft_s=4.0, p90_tpot_s=0.02, valid=True, requests=300),
             LoadPoint(users=16, p90_ttft_s=8.0, p90_tpot_s=0.02, valid=True, requests=100)]  # 5.0 s together
    assert what_if(1, heavy, 5.0, 0.05).capacity_users == 16
    invalid = _pts((16, 1.0, 0.02, True), (16, 1.0, 0.02, False))
    assert what_if(1, invalid, 5.0, 0.05).coverage is Coverage.FEWER_THAN


def test_parse_slo_accepts_seconds_and_milliseconds_and_refuses_the_rest():
    assert parse_slo("ttft=10,tpot=0.06", 30, 0.05) == (10.0, 0.06)
    assert parse_slo("tpot=60ms", 30, 0.05) == (30, pytest.approx(0.06))
    assert parse_slo(" TTFT = 5s ", 30, 0.05) == (5.0, 0.05)
    for bad, words in [("ttft", "valid keys: ttft, tpot"), ("latency=3", "valid keys"), ("ttft=x", "not a number"),
                       ("ttft=-1", "more than 0"), ("tpot=100", "at most 60"), ("ttft=1,ttft=2", "twice"), ("", "no targets")]:
        with pytest.raises(ConfigError) as exc:
            parse_slo(bad, 30, 0.05)
        assert words in str(exc.value) and exc.value.key == "--slo"


def test_study_status_slo_option(study):
    tmp, storage = study
    r = run_cli(["study", "status", "wi", "--storage", storage, "--slo", "ttft=10,tpot=0.06", "--json"], cwd=tmp)
    assert r.returncode == 0, r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["what_if"]["slo"] == {"p90_ttft_s": 10.0, "p90_tpot_s": 0.06}
    assert {"trial", "capacity_users", "upper_bound_users", "coverage", "text", "short", "stored_capacity_users"} \
        <= set(doc["what_if"]["trials"][0])
    r = run_cli(["study", "status", "wi", "--storage", storage, "--slo", "ttft=10"], cwd=tmp)
    assert r.returncode == 0 and "what if P90 TTFT <= 10 s and P90 TPOT <= 50 ms" in r.stdout
    r = run_cli(["study", "status", "wi", "--storage", storage, "--slo", "itl=3"], cwd=tmp)
    assert r.returncode == 2 and "--slo" in r.stderr and "valid keys: ttft, tpot" in r.stderr
