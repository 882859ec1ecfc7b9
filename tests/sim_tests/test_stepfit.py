"""Fitting the step-time mechanism to SGLang's own step logs: the log parser, the windows, and
that the fit recovers known values from windows a known model produced."""

import copy
import dataclasses
import random

import pytest

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.sim.calibrate import load_calibration
from tuner.sim.steplog import DecodeLine, PrefillLine, StepWindow, decode_windows, parse_step_lines
from tuner.sim.stepfit import (TrialSteps, _prefill_work, fit, fit_context, get_path, new_variant_times,
                               scale_prefill, set_path, trials_from_database, window_time)
from tuner.sim.warmup import CachedKernels
from tests.conftest import REPO

@pytest.fixture(autouse=True)
def no_committed_profiles(tmp_path, monkeypatch):
    """These windows come from the roofline model with known parameters: the committed H200
    tables of Qwen3-30B-A3B would replace the operators those parameters act on."""
    from tuner.sim import optable

    monkeypatch.setattr(optable, "PROFILE_DIR", tmp_path / "no-profiles")
    monkeypatch.delenv(optable.PROFILE_DIRS_ENV, raising=False)
    optable.clear_cache()
    yield
    optable.clear_cache()


LOG = """\
[2026-12-01 09:38:29] Prefill batch, #new-seq: 1, #new-token: 2951, #cached-token: 2000, token usage: 0.03, #running-req: 6, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1379.87
[2026-12-01 09:38:30] Decode batch, #running-req: 11, #token: 36209, token usage: 0.05, cuda graph: True, gen throughput (token/s): 137.21, #queue-req: 0
[2026-12-01 09:38:31] INFO:     127.0.0.1:45832 - "POST /generate HTTP/1.1" 200 OK
[2026-12-01 09:38:31] Prefill batch, #new-seq: 2, #new-token: 4183, #cached-token: 4000, token usage: 0.05, #running-req: 11, #queue-req: 1, #pending-token: 0, cuda graph: False, input throughput (token/s): 7033.82
[2026-12-01 09:38:31] Decode batch, #running-req: 13, #token: 38784, token usage: 0.05, cuda graph: True, gen throughput (token/s): 608.24, #queue-req: 0
[2026-12-01 09:38:32] Decode batch, #running-req: 9, #token: 30000, token usage: 0.04, cuda graph: True, gen throughput (token/s): 500.00, #queue-req: 0
[2026-12-01 09:38:35] Prefill batch, #new-seq: 1, #new-token: 300, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 12.00
[2026-12-01 09:38:36] Decode batch, #running-req: 1, #token: 2300, token usage: 0.00, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0
"""


def test_step_lines_are_read_in_order_with_their_fields():
    ev = parse_step_lines(LOG.splitlines())
    assert [type(e) for e in ev] == [PrefillLine, DecodeLine, PrefillLine, DecodeLine, DecodeLine, PrefillLine,
                                     DecodeLine]
    p, d = ev[2], ev[3]
    assert (p.seqs, p.new_tokens, p.cached_tokens, p.running, p.queued) == (2, 4183, 4000, 11, 1)
    assert (d.running, d.kv_tokens, d.cuda_graph, d.gen_tokens_per_s) == (13, 38784, True, 608.24)
    assert d.t - ev[1].t == 1.0  # UTC seconds


def test_windows_hold_the_prefills_between_decode_lines_and_leave_out_idle_ones():
    w = decode_windows(parse_step_lines(LOG.splitlines()))
    # the first decode line opens the first window; the last window had a prefill while nothing ran
    assert len(w) == 2
    first, second = w
    assert [(p.seqs, p.new_tokens) for p in first.prefills] == [(2, 4183)]
    assert (first.running_start, first.running_end) == (11, 13)
    assert first.wall_s == pytest.approx(40 * 12 / 608.24)  # 40 decode batches at the mean batch
    assert second.prefills == [] and second.wall_s == pytest.approx(40 * 11 / 500.0)


def test_committed_h200_logs_give_hundreds_of_windows():
    trials = trials_from_database(REPO / "results" / "h200-sglang" / "h200-sglang-qwen3.db")
    labels = {t.label for t in trials}
    assert {"h200-sglang-qwen3#0", "h200-sglang-qwen3#1"} <= labels  # and the trials run since
    for t in trials:
        assert len(t.windows) > (150 if t.label.endswith(("#0", "#1")) else 50)
        assert t.sglang_version == "0.5.17" and t.flags["attention-backend"] == "triton"
        assert t.shared_prefix_tokens == 2000
    assert fit_context(trials) == {"sglang_version": "0.5.17", "attention_backend": "triton",
                                   "prefill_cuda_graph": False}


# the scheduler's CPU floor binds small batches (6 ms + 0.12 ms per request against a GPU step of
# ~4 ms at one request), the GPU larger ones: both are in the data
TRUE = {("overhead", "cpu_step_s"): 0.006, ("overhead", "per_request_s"): 1.2e-4, ("overhead", "layer_s"): 5e-5,
        ("memory_efficiency",): 0.6, ("kv_memory_efficiency",): 0.4, ("overhead", "eager_prefill_per_layer_s"): 6e-4,
        ("compute_efficiency", "moe"): 0.3,
        ("compute_efficiency", "extend_attention", "gqa"): 0.3,
        ("compute_efficiency", "extend_attention", "gqa_causal"): 0.3}
FLAGS = {"attention-backend": "triton", "disable-prefill-cuda-graph": True}


def _synthetic_trial(cal, n_windows=160, seed=1, flags=FLAGS) -> TrialSteps:
    """Windows whose wall times a known calibration produced (the log's throughput inverted)."""
    rng = random.Random(seed)
    t = TrialSteps(label="synthetic#0", study="synthetic", trial=0, model=get_model("qwen3-30b-a3b"),
                   gpu=get_gpu("h200"), gpus=1, nodes=1, host_memory_gb=128, flags=dict(flags), knobs={},
                   sglang_version="0.5.17", shared_prefix_tokens=2000)
    sm = t.step_model(cal)
    for i in range(n_windows):
        small = i % 3 == 0  # a third of the windows decode a few requests: the CPU floor binds them
        n0, n1 = (rng.randint(1, 3), rng.randint(1, 3)) if small else (rng.randint(1, 40), rng.randint(1, 40))
        # short contexts in the small windows: a long one's split-KV decode latency outlasts the floor
        lo, hi = (300, 1500) if small else (2000, 20000)
        kv0, kv1 = n0 * rng.randint(lo, hi), n1 * rng.randint(lo, hi)
        prefills = [] if small else [
            PrefillLine(0.0, rng.choice((1, 1, 2)), rng.randint(50, 6000), rng.choice((0, 2000, 9000)), n0, 0)
            for _ in range(rng.choice((0, 1, 1, 2)))]
        w = StepWindow(float(i), float(i + 1), n0, n1, kv0, kv1, 1.0, True, prefills, source="synthetic.log")
        wall = window_time(sm, w, t.shared_prefix_tokens)
        w.gen_tokens_per_s = w.gen_tokens / wall
        t.windows.append(w)
    return t


def test_a_parameter_the_windows_cannot_see_stays_at_its_prior():
    base = load_calibration("h200")
    truth = copy.deepcopy(base)
    set_path(truth, ("overhead", "cpu_step_s"), 0.002)  # below every GPU step: never binds
    trial = _synthetic_trial(truth, n_windows=60)
    for w in trial.windows:  # only large batches
        w.running_start, w.running_end = 30, 30
    sm = trial.step_model(truth)
    for w in trial.windows:
        w.gen_tokens_per_s = w.gen_tokens / window_time(sm, w, trial.shared_prefix_tokens)
    res = fit([trial], calibration=base)
    prior = get_path(base, ("overhead", "cpu_step_s"))
    assert prior != 0.002
    assert get_path(res.calibration, ("overhead", "cpu_step_s")) == pytest.approx(prior, rel=0.05)


def test_the_fit_recovers_the_mechanism_that_produced_the_windows():
    base = load_calibration("h200")  # the priors: no fitted entry without a context
    truth = copy.deepcopy(base)
    for path, v in TRUE.items():
        set_path(truth, path, v)
    trial = _synthetic_trial(truth)
    res = fit([trial], calibration=base)
    # decode mechanism: recovered closely (many windows see it)
    for path in (("overhead", "cpu_step_s"), ("memory_efficiency",)):
        assert get_path(res.calibration, path) == pytest.approx(TRUE[path], rel=0.15), path
    # prefill: its parameters trade off against each other (and against the priors: windows are
    # mostly decode time), but the prefill time the windows hold comes back
    fitted, true = trial.step_model(res.calibration), trial.step_model(truth)
    batches = [_prefill_work(p) for w in trial.windows for p in w.prefills]
    assert sum(fitted.gpu_time([b]) for b in batches) == pytest.approx(sum(true.gpu_time([b]) for b in batches),
                                                                       rel=0.15)
    # the window times come back (prior pull included)
    assert res.residuals["synthetic#0"]["median_abs_error"] < 0.03
    # an MLA-only parameter is not seen by GQA data: left at its prior, and said so
    assert "compute_efficiency.extend_attention.mla_absorbed" in res.fixed
    assert get_path(res.calibration, ("compute_efficiency", "decode_attention")) == \
        get_path(base, ("compute_efficiency", "decode_attention"))


def test_prefill_scale_makes_the_fitted_parts_of_a_prefill_step_longer_by_the_scale():
    """The fused MoE, extend attention and launch costs scale; the other linears' efficiency is
    measured (operator tables), so their time stays."""
    cal = load_calibration("h200")
    t = _synthetic_trial(cal, n_windows=1)
    w = _prefill_work(PrefillLine(0.0, 2, 3000, 8000, 4, 0))
    before, after = t.step_model(cal), t.step_model(scale_prefill(cal, 1.5))
    assert after.moe_time(3000) / before.moe_time(3000) == pytest.approx(1.5, rel=0.05)
    assert after.extend_attention_time(w) / before.extend_attention_time(w) == pytest.approx(1.5, rel=0.05)
    assert after.linear_time(3000, 2) == pytest.approx(before.linear_time(3000, 2), rel=1e-9)
    assert 1.2 < after.gpu_time([w]) / before.gpu_time([w]) < 1.5


def test_a_fit_with_values_held_moves_only_the_rest():
    """Prefill CUDA graphs (SGLang's default for Qwen3): the eager fit's scheduler and kernel
    values are held; the windows give the graph prefill step's launch cost alone."""
    base = load_calibration("h200")
    for path, v in TRUE.items():
        set_path(base, path, v)
    truth = copy.deepcopy(base)
    # 72 ms: longer than the kernels of the windows' shorter prefills (the step is the longer of
    # the two), so the windows see it
    set_path(truth, ("overhead", "prefill_per_layer_s"), 1.5e-3)
    trial = _synthetic_trial(truth, flags={"attention-backend": "triton"})
    assert trial.step_model_prefill_graph()
    held = ["overhead.cpu_step_s", "overhead.per_request_s", "overhead.layer_s", "memory_efficiency",
            "kv_memory_efficiency", "overhead.prefill_batch_s", "compute_efficiency.moe",
            "compute_efficiency.extend_attention"]
    res = fit([trial], calibration=base, held=held)
    assert set(res.values) == {"overhead.prefill_per_layer_s"}
    assert res.values["overhead.prefill_per_layer_s"] == pytest.approx(1.5e-3, rel=0.1)
    for path in TRUE:
        assert get_path(res.calibration, path) == get_path(base, path), path
    # the prefill scale moves only what is not held, and the fit writes only what it fitted
    scaled = scale_prefill(res.calibration, 2.0, held)
    assert get_path(scaled, ("compute_efficiency", "moe")) == get_path(base, ("compute_efficiency", "moe"))
    assert get_path(scaled, ("overhead", "prefill_per_layer_s")) == pytest.approx(
        2.0 * res.values["overhead.prefill_per_layer_s"])
    res.prefill_scale = object()  # as after stage 2: the prefill values are written, less those held
    assert res.as_overrides()["overhead"] == {"prefill_per_layer_s": pytest.approx(res.values[
        "overhead.prefill_per_layer_s"], rel=1e-3), "eager_prefill_per_layer_s": pytest.approx(6e-4)}


def test_trials_of_different_contexts_are_not_fitted_together():
    cal = load_calibration("h200")
    a = _synthetic_trial(cal, n_windows=1)
    b = _synthetic_trial(cal, n_windows=1)
    b.flags = {"attention-backend": "fa3"}
    with pytest.raises(ConfigError, match="different calibration contexts"):
        fit_context([a, b])


# ---- fp8 block-quantized weights: a fixed cost per linear call ------------------------------------

def _decode_gpu(flags, cal, batch=4):
    from tuner.sim.stepfit import _decode_work

    t = _synthetic_trial(cal, n_windows=0)
    t.flags = {**FLAGS, **flags}
    return t.step_model(cal).gpu_time([_decode_work(batch, batch * 5000, 2000)])


def test_every_fp8_block_linear_call_costs_its_fixed_time_and_bf16_none():
    cal = load_calibration("h200")
    with_cost = copy.deepcopy(cal)
    set_path(with_cost, ("overhead", "fp8_block_gemm_s"), 2e-5)
    set_path(cal, ("overhead", "fp8_block_gemm_s"), 0.0)
    # Qwen3-30B-A3B fp8: per layer the qkv and o projections and both expert GEMMs (48 layers)
    extra = _decode_gpu({"quantization": "fp8"}, with_cost) - _decode_gpu({"quantization": "fp8"}, cal)
    assert extra == pytest.approx(4 * 48 * 2e-5, rel=1e-6)
    assert _decode_gpu({}, with_cost) == pytest.approx(_decode_gpu({}, cal))  # bf16 weights: no such call
    # tuned expert tiles speed up the GEMMs, not the input quantization beside them
    tuned = {**with_cost, "moe_tuned_speedup": {1: 2.0, 4096: 2.0}, "moe_tuned_speedup_by_shape": {}}
    t = _synthetic_trial(tuned, n_windows=0)
    t.flags = {**FLAGS, "quantization": "fp8"}
    t.knobs = {"moe-tile-configs": "tuned"}
    sm = t.step_model(tuned)
    t.knobs = {}
    t._plan = None
    plain = t.step_model(tuned)
    moe_roof = plain.moe_time(8) - plain.moe_fixed_s
    assert sm.moe_time(8) == pytest.approx(moe_roof / 2.0 + plain.moe_fixed_s)


def test_the_fit_recovers_the_fixed_cost_of_fp8_calls():
    base = load_calibration("h200")
    truth = copy.deepcopy(base)
    for path, v in TRUE.items():
        set_path(truth, path, v)
    set_path(truth, ("overhead", "fp8_block_gemm_s"), 2.5e-5)
    bf16 = _synthetic_trial(truth, n_windows=120, seed=2)
    fp8 = TrialSteps(label="synthetic#1", study="synthetic", trial=1, model=bf16.model, gpu=bf16.gpu, gpus=1, nodes=1,
                     host_memory_gb=128, flags={**FLAGS, "quantization": "fp8"}, knobs={}, sglang_version="0.5.17",
                     shared_prefix_tokens=2000, windows=copy.deepcopy(_synthetic_trial(truth, n_windows=120,
                                                                                       seed=3).windows))
    sm = fp8.step_model(truth)
    for w in fp8.windows:  # the same traffic, timed with fp8 weights
        w.gen_tokens_per_s = w.gen_tokens / window_time(sm, w, fp8.shared_prefix_tokens)
    res = fit([bf16, fp8], calibration=base)
    assert res.values["overhead.fp8_block_gemm_s"] == pytest.approx(2.5e-5, rel=0.25)
    # without an fp8 trial the data cannot see it: the prior stays
    only_bf16 = fit([bf16], calibration=base)
    assert "overhead.fp8_block_gemm_s" in only_bf16.fixed


# ---- fresh-server stalls, measured from the windows ------------------------------------------------

def test_stalls_in_a_fresh_servers_first_minute_are_counted_timed_and_written_as_calibration():
    from tuner.sim.stepfit import WARMUP_LOOK_S, STALL_KEY, warmup_stalls

    cal = load_calibration("h200")
    trials = []
    for k, stall_at in enumerate(((3, 8, 20), (5, 12, 30))):  # seconds after the first window
        t = _synthetic_trial(cal, n_windows=100, seed=10 + k)
        t.label, t.trial = f"synthetic#{k}", k
        for i, w in enumerate(t.windows):  # one window a second, from a server log of its own
            w.source = f"server{k}.log"
            if i in stall_at:  # 0.8 s more than the model
                w.gen_tokens_per_s = w.gen_tokens / (w.wall_s + 0.8)
        trials.append(t)
    ws = warmup_stalls(trials, cal)
    assert ws.servers == 2 and ws.count == 3.0 and len(ws.stalls) == 6
    assert ws.stall_s == pytest.approx(0.8, rel=0.02)
    assert [round(s["after_s"], 1) for s in ws.stalls[:3]] == [3.5, 8.5, 20.5]
    assert 5 < ws.decay_s < WARMUP_LOOK_S and ws.later_rate_per_min == 0.0
    assert ws.new_kernel_windows == 0  # no prefill times in these windows: the time schedule is written
    doc = ws.as_calibration()
    assert doc["stall_s"] == pytest.approx(0.8, rel=0.02) and doc["decay_s"] == pytest.approx(ws.decay_s, rel=1e-3)
    assert doc["per_start"] >= 3.0  # the stalls expected beyond the first minute too
    assert STALL_KEY == "fresh_server_stalls"


def test_the_extra_time_of_windows_running_a_new_moe_kernel_variant_is_measured_per_kernel_built():
    from tuner.sim.stepfit import warmup_stalls
    from tuner.sim.warmup import moe_variant, shipped_groups

    cal = load_calibration("h200")
    groups = shipped_groups("NVIDIA H200", "0.5.17", "E=128,N=768")  # what warmup_stalls reads for an H200 trial
    t = TrialSteps(label="synthetic#0", study="synthetic", trial=0, model=get_model("qwen3-30b-a3b"),
                   gpu=get_gpu("h200"), gpus=1, nodes=1, host_memory_gb=128, flags=dict(FLAGS), knobs={},
                   sglang_version="0.5.17", shared_prefix_tokens=2000)
    sm = t.step_model(cal)
    # prefill sizes: 1800 new, 2500 (key 2048, as 1800), 1801 (odd: new), 300 (key 256: new), 301 (odd: new);
    # 1500 (key 1536: the config of 2048), 1802, 2502, 299 seen
    sizes = [1800, 2500, 1801, 300, 1800, 2502, 301, 1500, 1802, 299]
    seen = set()
    for i, n in enumerate(sizes):
        w = StepWindow(float(i), float(i + 1), 8, 8, 80_000, 80_000, 1.0, True,
                       [PrefillLine(i + 0.5, 1, n, 4000, 8, 0)], source="not-a-file.log")
        wall = window_time(sm, w, t.shared_prefix_tokens)
        v = moe_variant(n, groups, 8)
        if v not in seen:  # the compile: 0.6 s more
            seen.add(v)
            wall += 0.6
        w.gen_tokens_per_s = w.gen_tokens / wall
        t.windows.append(w)
    ws = warmup_stalls([t], cal)
    assert ws.new_kernel_windows == 4 and ws.new_kernel_window_stalls == 4  # 1800, 1801, 300, 301
    assert ws.other_prefill_windows == 6 and ws.other_prefill_window_stalls == 0
    # a fused-MoE variant builds two kernels (its up and down GEMMs): 0.3 s each
    assert ws.per_new_kernel_s == pytest.approx(0.3, abs=0.005)
    assert ws.as_calibration()["per_new_kernel_s"] == pytest.approx(0.3, abs=0.005)
    assert ws.as_calibration()["moe_config_groups"] == {"E=128,N=768": groups}
    # a server on a pinned cache where earlier servers ran 1800 and 300 builds only 1801's and 301's
    built = dataclasses.replace(t, cached_kernels=CachedKernels((1800, 300)))
    assert new_variant_times(t, "not-a-file.log", groups, 8) == [0.5, 0.5, 2.5, 2.5, 3.5, 3.5, 6.5, 6.5]
    assert new_variant_times(built, "not-a-file.log", groups, 8) == [2.5, 2.5, 6.5, 6.5]


CHUNKED_LOG = """\
[2026-12-04 14:21:30] server_args=ServerArgs(model_path='m', max_prefill_tokens=16384, chunked_prefill_size=2048, page_size=1, max_micro_batch_size=None)
[2026-12-04 14:22:27] Prefill batch, #new-seq: 2, #new-token: 2048, #cached-token: 4000, token usage: 0.00, #running-req: 2, #queue-req: 3, #pending-token: 14467, cuda graph: False
[2026-12-04 14:22:27] Prefill batch, #new-seq: 1, #new-token: 2048, #cached-token: 0, token usage: 0.00, #running-req: 3, #queue-req: 2, #pending-token: 12419, cuda graph: False
[2026-12-04 14:22:28] Prefill batch, #new-seq: 3, #new-token: 1500, #cached-token: 4000, token usage: 0.00, #running-req: 3, #queue-req: 0, #pending-token: 0, cuda graph: False
[2026-12-04 14:22:28] Prefill batch, #new-seq: 1, #new-token: 2048, #cached-token: 2000, token usage: 0.00, #running-req: 6, #queue-req: 0, #pending-token: 0, cuda graph: False
[2026-12-04 14:22:29] Prefill batch, #new-seq: 1, #new-token: 300, #cached-token: 5000, token usage: 0.00, #running-req: 7, #queue-req: 0, #pending-token: 0, cuda graph: False
"""


def test_a_chunked_requests_later_chunks_get_back_the_prefix_the_log_leaves_out():
    lines = parse_step_lines(CHUNKED_LOG.splitlines())
    assert [p.extend_items() for p in lines] == [
        [(1024, 2000), (1024, 2000)],  # fills the 2,048 budget: its last request was cut
        [(2048, 3024)],  # that request again: its hit and its first chunk before it, #cached-token 0
        [(500, 5072), (500, 2000), (500, 2000)],  # its last chunk first, two new requests after it
        [(2048, 2000)],  # fills the budget by chance ...
        [(300, 5000)],  # ... a single request with a hit is a new one: nothing carried
    ]
    # without the server_args line (or with chunking off) the log's own counts stand
    plain = parse_step_lines(CHUNKED_LOG.splitlines()[1:])
    assert [p.extend_items() for p in plain][1] == [(2048, 0)]
    assert parse_step_lines(CHUNKED_LOG.splitlines()[1:], chunk_tokens=2048)[1].extend_items() == [(2048, 3024)]
    off = CHUNKED_LOG.replace("chunked_prefill_size=2048", "chunked_prefill_size=-1")
    assert [p.extend_items() for p in parse_step_lines(off.splitlines())][1] == [(2048, 0)]


def test_a_continued_chunk_is_timed_over_its_prefix():
    """A later chunk runs its attention over the earlier ones: the window time counts them."""
    t = _synthetic_trial(load_calibration("h200"), n_windows=1)
    sm = t.step_model(load_calibration("h200"))
    bare = PrefillLine(0.0, 1, 2048, 0, 4, 0)
    continued = PrefillLine(0.0, 1, 2048, 0, 4, 0, chunk_prefix_tokens=20_000, chunk_new_tokens=2048)
    assert sm.gpu_time([_prefill_work(continued)]) > 1.2 * sm.gpu_time([_prefill_work(bare)])
    assert _prefill_work(continued).extend_items == ((2048, 20_000),)


def test_the_fit_does_not_count_a_cold_machines_jit_wait_as_triton_builds():
    from tuner.sim.stepfit import first_long_prefill_time, warmup_stalls
    from tuner.sim.warmup import JIT_MODULE_BUILD_S, jit_wait_s

    cal = load_calibration("h200")
    dsv3 = get_model({"name": "deepseek-v3", "overrides": {"num_hidden_layers": 5}})
    flags = {**FLAGS, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3"}

    def trial(cached):
        t = TrialSteps(label="synthetic#0", study="synthetic", trial=0, model=dsv3, gpu=get_gpu("h200"), gpus=1,
                       nodes=1, host_memory_gb=128, flags=dict(flags), knobs={}, sglang_version="0.5.17",
                       shared_prefix_tokens=2000, cached_kernels=cached)
        sm = t.step_model(cal)
        for i, n in enumerate([300, 2048, 2048, 300, 1500, 1500]):  # first long prefill: the second window
            w = StepWindow(float(i), float(i + 1), 8, 8, 80_000, 80_000, 1.0, True,
                           [PrefillLine(i + 0.5, 1, n, 4000, 8, 0)], source="not-a-file.log")
            wall = window_time(sm, w, t.shared_prefix_tokens) + (JIT_MODULE_BUILD_S if i == 1 else 0.0)
            w.gen_tokens_per_s = w.gen_tokens / wall
            t.windows.append(w)
        return t

    cold = trial(CachedKernels(jit_cold=True))
    assert jit_wait_s(cold.model, cold.cached_kernels) == JIT_MODULE_BUILD_S
    assert first_long_prefill_time(cold, "not-a-file.log") == 1.5
    assert jit_wait_s(dsv3, None) == 0.0 and jit_wait_s(get_model("qwen3-30b-a3b"), CachedKernels(jit_cold=True)) == 0.0
    # told the machine was cold, the fit leaves the wait out of the new-variant windows' excess
    with_record, without = warmup_stalls([cold], cal), warmup_stalls([trial(None)], cal)
    assert with_record.per_new_kernel_s < 0.05  # the windows ran at the model's time but for the wait
    assert without.per_new_kernel_s > 0.5  # else the wait is charged to the Triton builds (9.2 s over 10)
