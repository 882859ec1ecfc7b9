"""The simulator's window report (what tuner.explain attributes latencies to) is bookkeeping: the
predictions are the same with and without it, also for later load points on the same memoised
step-time model, and its decode-step parts add up to the model's step time."""

import pytest

from tuner.config.load import load_study
from tuner.sim import simulate as sim_mod
from tuner.sim.breakdown import DECODE_PARTS, decode_step_parts
from tuner.sim.steptime import RankWork

CONFIGS = [{"tp-size": 8, "quantization": "modelopt_fp4"},
           {"tp-size": 8, "attn-dp-size": 4, "ep-size": 8, "quantization": "modelopt_fp4",
            "enable-hierarchical-cache": True, "hicache-ratio": 2.0}]


def _search(study, flags):
    sim_mod._PREPARED.clear()
    out = []
    for users in (8, 24, 48, 32, 40):  # a capacity search's order, on one memoised model
        m = sim_mod.simulate_load_point(study.model, "h200", 8, flags, {}, study.workload_profile(), users,
                                        warmup_s=30, duration_s=90)
        out.append((m.p50_ttft_s, m.p90_ttft_s, m.p90_tpot_s, m.p90_itl_s, m.requests, m.prefix_cache_hit_rate,
                    m.extra["step_time_source"], m.extra["reprefill_tokens"]))
    return out


@pytest.mark.parametrize("flags", CONFIGS)
def test_predictions_do_not_depend_on_the_window_report(flags, monkeypatch):
    study = load_study("h200")
    with_report = _search(study, flags)
    monkeypatch.setattr(sim_mod, "window_report", lambda *a, **k: {})
    without = _search(study, flags)
    assert with_report == without


def test_decode_step_parts_add_up_to_the_step_time():
    study = load_study("h200")
    plan, layout, cal, model = sim_mod._prepare(sim_mod.get_model(study.model), sim_mod.get_gpu("h200"), 8,
                                                CONFIGS[1], {}, 1, None, None, "0.5.23")
    works = [RankWork(decode_reqs=n, decode_ctx_tokens=n * 20_000) for n in (12, 9, 14, 10)]
    parts = decode_step_parts(model, works, sum(w.decode_reqs for w in works), overlap=True)
    assert set(parts) == set(DECODE_PARTS) and all(v >= 0 for v in parts.values())
    assert sum(parts.values()) == pytest.approx(model.step_time(works, 45, overlap=True))
    assert parts["moe"] > 0 and parts["attention"] > 0 and parts["communication"] > 0
