import numpy as np
import pytest

from tuner.workload.fit import fit_lognormal, fit_trace
from tuner.workload.importers import load_trace
from tuner.workload.profiles import load_profile
from tuner.workload.sessionlog import write_session_log


def test_fit_lognormal_recovers_parameters():
    rng = np.random.default_rng(1)
    x = rng.lognormal(6.0, 0.8, 20000)
    f = fit_lognormal(np.concatenate([x, [0, -3]]))
    assert f.dist.mu == pytest.approx(6.0, abs=0.02)
    assert f.dist.sigma == pytest.approx(0.8, abs=0.02)
    assert f.excluded == 2 and f.n == 20000
    assert f.ks_statistic < 0.02
    bad = fit_lognormal(rng.uniform(1, 2, 5000))
    assert bad.ks_statistic > f.ks_statistic  # KS tells a poor fit


def test_fit_trace_recovers_profile_from_its_own_sessions(tmp_path):
    truth = load_profile("coding-agent").model_copy(update={"max_context_tokens": 10**7})
    path = tmp_path / "s.jsonl"
    write_session_log(truth, path, sessions=600, seed=5)
    profile, report = fit_trace(load_trace(path))
    assert profile.system_prefix_tokens == truth.system_prefix_tokens
    for key in ("new_tokens_per_turn", "output_tokens_per_turn", "think_time_s"):
        got, want = getattr(profile, key), getattr(truth, key)
        assert got.mu == pytest.approx(want.mu, abs=0.1), key
        assert got.sigma == pytest.approx(want.sigma, abs=0.1), key
    cmp_ = report["input_tokens_per_turn"]
    assert cmp_["data"]["p50"] == pytest.approx(cmp_["model"]["p50"], rel=0.25)
    assert report["context_resets"] == 0


def test_fit_claude_code_excerpt_excludes_subagents_by_default(tmp_path):
    from tests.workload_tests.conftest import DATA

    trace = load_trace(DATA / "claude_code_requests_excerpt.csv")
    _, main_only = fit_trace(trace, model_sessions=100)
    _, with_sub = fit_trace(trace, include_subagents=True, model_sessions=100)
    assert main_only["excluded_subagent_sessions"] > 0
    assert with_sub["sessions"] == main_only["sessions"] + main_only["excluded_subagent_sessions"]
