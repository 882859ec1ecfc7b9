"""Fitted calibration entries apply only where they were measured; the overlap scheduler sees an
arrival one step late; the fitted H200 entry changes what the simulator predicts for that context."""

import math

import pytest
import yaml

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.sim.calibrate import (apply_fitted, calibration_context, load_calibration, same_architecture_gpus,
                                 transfer_fitted, write_fitted)
from tuner.sim.engine import Rank, ReplicaEngine, Req, Stats
from tuner.sim.cache import SessionPrefixCache
from tuner.planner import parse_layout, plan_memory
from tuner.sim.simulate import build_step_model, scheduler_rules

QWEN = "qwen3-30b-a3b"
TRITON_EAGER = {"attention-backend": "triton", "disable-prefill-cuda-graph": True}


def test_the_context_names_version_backend_and_prefill_graphs():
    m, g = get_model(QWEN), get_gpu("h200")
    assert calibration_context(m, g, TRITON_EAGER, "0.5.17") == {
        "sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    assert calibration_context(m, g, {}, None) == {
        "sglang_version": "0.5.23", "attention_backend": "fa3", "prefill_cuda_graph": True}
    # 0.5.17 runs MLA (not DSA) prefill without the breakable graph
    assert not calibration_context(get_model("deepseek-v3"), g, {}, "0.5.17")["prefill_cuda_graph"]


def test_an_entry_applies_only_where_its_conditions_hold():
    base = {"overhead": {"cpu_step_s": 1.0}, "fitted": [
        {"name": "a", "when": {"sglang_version": "0.5.17", "attention_backend": "triton"},
         "values": {"overhead": {"cpu_step_s": 2.0}}, "checked": {"load_points": 3}}]}
    hit = apply_fitted(dict(base), {"sglang_version": "0.5.17", "attention_backend": "triton",
                                    "prefill_cuda_graph": False})
    assert hit["overhead"]["cpu_step_s"] == 2.0 and hit["fitted_applied"] == ["a"]
    assert hit["fitted_checks"] == [{"load_points": 3}] and "fitted" not in hit
    miss = apply_fitted(dict(base), {"sglang_version": "0.5.23", "attention_backend": "triton"})
    assert miss["overhead"]["cpu_step_s"] == 1.0 and miss["fitted_applied"] == []
    assert apply_fitted(dict(base), None)["fitted_applied"] == []  # no context: nothing applies
    with pytest.raises(ConfigError, match="unknown condition"):
        apply_fitted({"fitted": [{"when": {"gpu": "h200"}, "values": {}}]}, {}, file="x.yaml")
    with pytest.raises(ConfigError, match="values"):
        apply_fitted({"fitted": [{"when": {}}]}, {}, file="x.yaml")


def test_an_entry_whose_conditions_hold_in_part_gives_the_values_that_do_not_depend_on_the_rest():
    when = {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    entry = {"name": "a", "when": when, "checked": {"load_points": 9}, "values": {
        "overhead": {"cpu_step_s": 2.0, "prefill_per_layer_s": 7.0},
        "compute_efficiency": {"moe": 0.4, "extend_attention": {"gqa": 0.2}},
        "fresh_server_stalls": {"per_new_kernel_s": 0.5}}}
    base = {"overhead": {"cpu_step_s": 1.0, "prefill_per_layer_s": 1.0},
            "compute_efficiency": {"moe": 0.5, "extend_attention": 0.6}, "fresh_server_stalls": {"per_start": 0.0}}
    # prefill CUDA graphs: the scheduler, kernels and attention carry over; prefill launch and the
    # start-up compiles (captured with the graphs) do not
    graphs = apply_fitted({**base, "fitted": [entry]}, {**when, "prefill_cuda_graph": True})
    assert graphs["overhead"] == {"cpu_step_s": 2.0, "prefill_per_layer_s": 1.0}
    assert graphs["compute_efficiency"] == {"moe": 0.4, "extend_attention": {"gqa": 0.2}}
    assert graphs["fresh_server_stalls"] == {"per_start": 0.0}
    assert graphs["fitted_applied"] == ["a (in part: the values that do not depend on prefill_cuda_graph)"]
    assert sorted(graphs["fitted_partial"]["a"]) == ["compute_efficiency.extend_attention", "compute_efficiency.moe",
                                                     "overhead.cpu_step_s"]
    assert graphs["fitted_checks"] == []  # checked in another context
    # another attention backend: its attention efficiencies do not carry over, the MoE's does
    fa3 = apply_fitted({**base, "fitted": [entry]}, {**when, "attention_backend": "fa3"})
    assert fa3["compute_efficiency"] == {"moe": 0.4, "extend_attention": 0.6} and fa3["overhead"]["cpu_step_s"] == 2.0
    # another version: nothing
    assert apply_fitted({**base, "fitted": [entry]}, {**when, "sglang_version": "0.5.23"})["fitted_applied"] == []
    # an entry fitted for the context itself wins over one that holds in part, whatever the file order
    own = {"name": "b", "when": {**when, "prefill_cuda_graph": True}, "values": {"overhead": {"cpu_step_s": 3.0}}}
    both = apply_fitted({**base, "fitted": [own, entry]}, {**when, "prefill_cuda_graph": True})
    assert both["overhead"]["cpu_step_s"] == 3.0 and both["compute_efficiency"]["moe"] == 0.4
    assert both["fitted_applied"][-1] == "b"


def test_the_committed_h200_fit_carries_its_scheduler_and_kernels_to_prefill_cuda_graphs():
    m, g = get_model(QWEN), get_gpu("h200")
    eager = load_calibration("h200", context=calibration_context(m, g, TRITON_EAGER, "0.5.17"))
    graphs = load_calibration("h200", context=calibration_context(m, g, {"attention-backend": "triton"}, "0.5.17"))
    prior = load_calibration("h200")
    assert graphs["overhead"]["layer_s"] == eager["overhead"]["layer_s"] != prior["overhead"]["layer_s"]
    # the scheduler's CPU is measured (its probe), not fitted: every context takes the prior
    assert graphs["overhead"]["cpu_step_s"] == eager["overhead"]["cpu_step_s"] == prior["overhead"]["cpu_step_s"]
    assert graphs["compute_efficiency"]["moe"] == eager["compute_efficiency"]["moe"]
    # the launch cost of a graph prefill step is the graph servers' own fit (the eager fit's does not hold)
    assert graphs["overhead"]["prefill_per_layer_s"] != eager["overhead"]["prefill_per_layer_s"]
    import yaml
    from tuner.sim.calibrate import CALIBRATION_DIR
    own = next(e for e in yaml.safe_load((CALIBRATION_DIR / "h200.yaml").read_text())["fitted"]
               if e["name"] == "h200-sglang-0.5.17-triton")
    assert graphs["overhead"]["prefill_per_layer_s"] == own["values"]["overhead"]["prefill_per_layer_s"]
    assert graphs["fitted_applied"] == [
        "h200-sglang-0.5.17-triton-eager-prefill (in part: the values that do not depend on prefill_cuda_graph)",
        "h200-sglang-0.5.17-triton"]
    assert "per_new_kernel_s" not in graphs["fresh_server_stalls"]  # compiled while capturing, not on first use
    assert graphs["fitted_checks"][0]["load_points"] >= 2  # the graph entry's own check


def test_a_fit_where_another_context_fit_holds_in_part_starts_from_it_and_holds_its_values(tmp_path, monkeypatch):
    from tuner.sim import calibrate as calmod

    (tmp_path / "default.yaml").write_text((calmod.CALIBRATION_DIR / "default.yaml").read_text())
    eager_when = {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    (tmp_path / "h200.yaml").write_text(yaml.safe_dump({"fitted": [
        {"name": "eager", "when": eager_when,
         "values": {"overhead": {"cpu_step_s": 0.005, "prefill_per_layer_s": 0.002},
                    "compute_efficiency": {"moe": 0.5}}},
        {"name": "graphs-old", "when": {**eager_when, "prefill_cuda_graph": True},
         "values": {"overhead": {"prefill_per_layer_s": 0.0004}}}]}))
    monkeypatch.setattr(calmod, "CALIBRATION_DIR", tmp_path)
    base, held = calmod.fit_base("h200", {**eager_when, "prefill_cuda_graph": True})
    # the eager fit's scheduler and kernel values hold (and are held); its prefill launch cost does
    # not; the graph context's own old entry is what a new fit replaces, so it is no base
    assert sorted(held) == ["compute_efficiency.moe", "overhead.cpu_step_s"]
    assert base["overhead"]["cpu_step_s"] == 0.005 and base["compute_efficiency"]["moe"] == 0.5
    assert base["overhead"]["prefill_per_layer_s"] == calmod.load_calibration("h200")["overhead"]["prefill_per_layer_s"]
    # in the eager context the graph entry's only value (its launch cost) does not hold, and the
    # eager entry is the one a refit replaces: it starts from the priors
    prior_base, prior_held = calmod.fit_base("h200", eager_when)
    assert prior_held == [] and prior_base["overhead"]["cpu_step_s"] != 0.005


def test_write_fitted_replaces_the_entry_of_the_same_context_and_keeps_the_rest(tmp_path):
    (tmp_path / "h200.yaml").write_text("# header kept\nmemory_efficiency: 0.8\n")
    when = {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    write_fitted("h200", when=when, values={"overhead": {"cpu_step_s": 0.004}}, name="one", source="s1",
                 directory=tmp_path)
    write_fitted("h200", when=when, values={"overhead": {"cpu_step_s": 0.005}}, name="two", source="s2",
                 checked={"load_points": 9}, trials=["s#1", "s#2"], directory=tmp_path)
    text = (tmp_path / "h200.yaml").read_text()
    doc = yaml.safe_load(text)
    assert text.startswith("# header kept") and doc["memory_efficiency"] == 0.8
    assert [e["name"] for e in doc["fitted"]] == ["two"] and doc["fitted"][0]["checked"] == {"load_points": 9}
    assert doc["fitted"][0]["trials"] == ["s#1", "s#2"]  # what a fidelity check tells unseen points by


def test_the_committed_h200_fit_applies_to_0517_triton_eager_prefill_only():
    m, g = get_model(QWEN), get_gpu("h200")
    fitted = load_calibration("h200", context=calibration_context(m, g, TRITON_EAGER, "0.5.17"))
    default = load_calibration("h200", context=calibration_context(m, g, {}, "0.5.23"))
    assert fitted["fitted_applied"] and not default["fitted_applied"]
    assert fitted["fitted_checks"][0]["load_points"] >= 9
    assert fitted["memory_efficiency"] != default["memory_efficiency"]
    # the scheduler's CPU is not fitted: both take the probe's measurement (results/h100-sglang/sched-probe)
    assert fitted["overhead"]["cpu_step_s"] == default["overhead"]["cpu_step_s"] == pytest.approx(1.1e-3)


def test_a_gpu_without_its_own_fit_takes_the_fit_of_a_gpu_of_the_same_architecture():
    m = get_model(QWEN)
    ctx = calibration_context(m, get_gpu("h100"), TRITON_EAGER, "0.5.17")
    h100, h200 = load_calibration("h100", context=ctx), load_calibration("h200", context=ctx)
    assert h100["fitted_on"] == "h200" and h200["fitted_on"] is None
    assert h100["fitted_applied"] == [f"{name} (fitted on h200, same SM90)" for name in h200["fitted_applied"]]
    # efficiencies and host-side times carry over; each device's own files set its tile-config groups
    assert h100["overhead"] == h200["overhead"] and h100["compute_efficiency"] == h200["compute_efficiency"]
    assert h100["fresh_server_stalls"]["per_new_kernel_s"] == h200["fresh_server_stalls"]["per_new_kernel_s"]
    assert "moe_config_groups" in h200["fresh_server_stalls"]
    assert "moe_config_groups" not in h100["fresh_server_stalls"]
    assert all(c["gpu"] == "h200" for c in h100["fitted_checks"]) and h100["fitted_checks"]
    # not across architectures, and not where the context matches no entry anywhere
    assert "h200" not in same_architecture_gpus("b200") and same_architecture_gpus("h100") == ["h200"]
    assert load_calibration("b200", context=ctx)["fitted_applied"] == []
    other = calibration_context(m, get_gpu("h100"), {}, "0.5.23")
    assert load_calibration("h100", context=other)["fitted_applied"] == []
    assert load_calibration("h100")["fitted_applied"] == []  # no context: nothing applies


def test_a_gpu_own_fit_wins_over_a_transferred_one(tmp_path):
    when = {"sglang_version": "0.5.17"}
    (tmp_path / "h200.yaml").write_text(yaml.safe_dump({"fitted": [
        {"name": "big", "when": when, "values": {"overhead": {"cpu_step_s": 9.0}}}]}))
    ctx = {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    own = apply_fitted({"overhead": {"cpu_step_s": 1.0}, "fitted": [
        {"name": "mine", "when": when, "values": {"overhead": {"cpu_step_s": 2.0}}}]}, ctx)
    kept = transfer_fitted(own, "h100", ctx, directory=tmp_path)
    assert kept["overhead"]["cpu_step_s"] == 2.0 and kept["fitted_applied"] == ["mine"] and kept["fitted_on"] is None
    none = apply_fitted({"overhead": {"cpu_step_s": 1.0}}, ctx)
    moved = transfer_fitted(none, "h100", ctx, directory=tmp_path)
    assert moved["overhead"]["cpu_step_s"] == 9.0 and moved["fitted_on"] == "h200"
    # a broken entry in the other GPU's file is named, not skipped
    (tmp_path / "h200.yaml").write_text(yaml.safe_dump({"fitted": [{"when": {"gpu": "x"}, "values": {}}]}))
    with pytest.raises(ConfigError, match="unknown condition"):
        transfer_fitted(apply_fitted({}, ctx), "h100", ctx, directory=tmp_path)


def test_a_check_on_another_gpu_is_kept_beside_the_entry_and_read_only_on_that_gpu(tmp_path):
    from tuner.sim.calibrate import record_recheck

    when = {"sglang_version": "0.5.17"}
    ctx = {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    write_fitted("h200", when=when, values={"overhead": {"cpu_step_s": 0.005}}, name="e", source="s",
                 checked={"load_points": 9}, directory=tmp_path)
    record_recheck("h200", when=when, rechecked={"load_points": 30}, directory=tmp_path)
    record_recheck("h200", when=when, rechecked={"load_points": 10, "date": "d"}, directory=tmp_path, on_gpu="h100")
    entry = yaml.safe_load((tmp_path / "h200.yaml").read_text())["fitted"][0]
    # the H200's own record is not replaced by the H100's
    assert entry["rechecked"] == {"load_points": 30} and entry["rechecked_on"] == {"h100": {"load_points": 10, "date": "d"}}
    moved = transfer_fitted(apply_fitted({}, ctx), "h100", ctx, directory=tmp_path)
    assert moved["fitted_checks_here"] == [{"load_points": 10, "date": "d", "gpu": "h100"}]
    assert moved["fitted_rechecks"] == [{"load_points": 30, "gpu": "h200"}]
    own = apply_fitted({"fitted": [entry]}, ctx)  # on the H200 itself the H100's check is not its own
    assert own["fitted_checks_here"] == [] and own["fitted_rechecks"] == [{"load_points": 30}]


def test_the_transferred_fit_scales_with_the_h100s_own_bandwidth():
    """Same efficiencies, 30% less HBM bandwidth: decode at 8 users is slower on the H100 than on
    the H200 (the model gives 1.22-1.29x over three seeds; host-side time does not scale)."""
    from tuner.sim import simulate_load_point
    from tuner.workload.profiles import load_profile

    def tpot(gpu):
        m = simulate_load_point(QWEN, gpu, 1, {**TRITON_EAGER, "mem-fraction-static": 0.85}, {},
                                load_profile("coding-agent-40k"), 8, warmup_s=10, duration_s=20, seed=1,
                                host_memory_gb=128, sglang_version="0.5.17")
        assert m.extra["calibration_fitted_on"] == ("h200" if gpu == "h100" else None)
        return m.p50_tpot_s

    assert tpot("h100") > 1.15 * tpot("h200")


def _engine(flags, capacity=100_000):
    m, g = get_model(QWEN), get_gpu("h200")
    flags = {**flags, "max-total-tokens": capacity}
    plan = plan_memory(m, g, 1, flags, sglang_version="0.5.17")
    layout = parse_layout(m, flags, 1)
    rules = scheduler_rules(plan, layout, flags, "0.5.17")
    sm = build_step_model(m, g, plan, layout, flags, {}, load_calibration(g.name), 1, "0.5.17")
    rank = Rank(SessionPrefixCache(plan.kv_capacity_tokens_per_gpu, plan.page_size, 0), rules)
    done = []
    eng = ReplicaEngine([rank], sm, rules, stats=Stats(), on_finish=lambda r, t: done.append(r), max_jump=1)
    return eng, rank


def test_the_overlap_scheduler_sees_an_arrival_one_step_late():
    # with overlap the batch after the running one was formed before the request arrived:
    # one more decode step runs first (Scheduler.event_loop_overlap)
    eng, rank = _engine({})
    a = Req(0, 0, 0, 0.0, 1000, 400)
    rank.waiting.append(a)
    eng.step()
    eng.step()
    step_start, step_end = eng.last_step_start, eng.last_step_end
    b = Req(1, 1, 0, (step_start + step_end) / 2, 500, 10)
    rank.waiting.append(b)
    assert eng.seen_cutoff() == step_start
    dt = eng.step()  # a decode step: b is not seen yet
    assert b.sched_t is None and dt > 0
    eng.step()  # now b is prefilled: its batch was formed when that extra decode step began
    assert b.sched_t == pytest.approx(step_end)
    assert b.first_t is not None and b.first_t > step_end + dt


def test_without_overlap_an_arrival_is_seen_at_the_next_boundary():
    eng, rank = _engine({"disable-overlap-schedule": True})
    a = Req(0, 0, 0, 0.0, 1000, 400)
    rank.waiting.append(a)
    eng.step()
    eng.step()
    b = Req(1, 1, 0, (eng.last_step_start + eng.last_step_end) / 2, 500, 10)
    rank.waiting.append(b)
    assert eng.seen_cutoff() == math.inf
    eng.step()
    assert b.sched_t is not None  # prefilled right away


def test_an_idle_server_receives_an_arrival_at_once():
    eng, rank = _engine({})
    eng.clock = 5.0
    b = Req(1, 1, 0, 5.0, 500, 10)
    rank.waiting.append(b)
    eng.step()
    assert b.sched_t == 5.0 and b.first_t is not None


def test_record_recheck_adds_a_later_check_and_keeps_the_fit(tmp_path):
    from tuner.sim.calibrate import fitted_entries, record_recheck

    (tmp_path / "h200.yaml").write_text("# header kept\nmemory_efficiency: 0.8\n")
    when = {"sglang_version": "0.5.17", "attention_backend": "triton", "prefill_cuda_graph": False}
    write_fitted("h200", when=when, values={"overhead": {"cpu_step_s": 0.005}}, name="two", source="s2",
                 checked={"load_points": 9}, trials=["s#1", "s#2"], directory=tmp_path)
    record_recheck("h200", when=when, rechecked={"load_points": 20, "date": "d1"}, directory=tmp_path)
    record_recheck("h200", when=when, rechecked={"load_points": 48, "date": "d2"}, directory=tmp_path)
    text = (tmp_path / "h200.yaml").read_text()
    entry = yaml.safe_load(text)["fitted"][0]
    assert text.startswith("# header kept")
    assert entry["values"] == {"overhead": {"cpu_step_s": 0.005}} and entry["checked"] == {"load_points": 9}
    assert entry["rechecked"] == {"load_points": 48, "date": "d2"}  # the later record replaces the earlier
    assert [e["name"] for e in fitted_entries("h200", {**when, "prefill_cuda_graph": False}, directory=tmp_path)] == ["two"]
    assert fitted_entries("h200", {**when, "sglang_version": "0.5.23"}, directory=tmp_path) == []
    cal = apply_fitted({"fitted": yaml.safe_load(text)["fitted"]}, when)
    assert cal["fitted_rechecks"] == [{"load_points": 48, "date": "d2"}]
    with pytest.raises(ConfigError, match="no fitted entry"):
        record_recheck("h200", when={**when, "sglang_version": "0.5.23"}, rechecked={}, directory=tmp_path)
