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


def test_the_decode_split_charges_attention_for_the_longest_request():
    # Qwen3 on SGLang 0.5.17's Triton decode kernel: a batch with one long request is latency-bound
    flags = {"attention-backend": "triton", "quantization": "fp8", "disable-prefill-cuda-graph": True}
    _, _, _, model = sim_mod._prepare(sim_mod.get_model("qwen3-30b-a3b"), sim_mod.get_gpu("h200"), 1, flags, {}, 1,
                                      None, None, "0.5.17")
    at_mean = [RankWork(decode_reqs=8, decode_ctx_tokens=8 * 6000)]
    spread = [RankWork(decode_reqs=8, decode_ctx_tokens=8 * 6000, decode_max_ctx_tokens=30000,
                       decode_min_ctx_tokens=2000)]
    a, b = (decode_step_parts(model, w, 8, overlap=True) for w in (at_mean, spread))
    assert b["attention"] > 2 * a["attention"]
    assert sum(b.values()) == pytest.approx(model.step_time(spread, 8, overlap=True))


def test_the_window_report_reads_the_longest_context_the_engine_kept():
    study = load_study("h200-sglang-qwen3")
    sim_mod._PREPARED.clear()
    m = sim_mod.simulate_load_point(study.model, "h200", 1, {"attention-backend": "triton"}, {},
                                    study.workload_profile(), 16, warmup_s=30, duration_s=60, sglang_version="0.5.17")
    explain = m.extra["explain"]
    (batch,), (mean,), (longest,) = (explain[k] for k in ("mean_batch_per_rank", "mean_context_per_rank",
                                                          "mean_longest_context_per_rank"))
    assert batch > 1 and longest > 1.3 * mean > 0  # sessions at different turns decode together
    parts = explain["decode_parts_s"]
    assert parts["attention"] > 0
    assert sum(parts.values()) == pytest.approx(explain["mean_decode_itl_s"])
