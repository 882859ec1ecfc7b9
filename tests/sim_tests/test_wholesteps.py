"""Whole forward steps as fit data: the set file, the prefill step's launch against its kernels,
and that a fit given whole steps recovers what the windows alone cannot see."""

import copy
import json

import pytest

from tuner.errors import ConfigError
from tuner.sim.calibrate import load_calibration
from tuner.sim.stepfit import fit, get_path, set_path, whole_step_errors, window_time
from tuner.sim.steptime import RankWork
from tuner.sim.wholesteps import WholeStep, read_whole_step_sets, step_work

from tests.sim_tests.test_stepfit import FLAGS, TRUE, _synthetic_trial, no_committed_profiles  # noqa: F401

EAGER = {"tp-size": 1, "attention-backend": "triton", "disable-prefill-cuda-graph": True}


def _set_file(tmp_path, rows, flags=EAGER, fit_kinds=None, **extra):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = {"rows": "rows.jsonl", "model": "qwen3-30b-a3b", "gpu": "h200", "sglang_version": "0.5.17",
         "flags": flags, **extra}
    if fit_kinds is not None:
        s["fit"] = fit_kinds
    import yaml
    path = tmp_path / "sets.yaml"
    path.write_text(yaml.safe_dump({"sets": [s]}))
    return path


def _lone_prefill(tokens: int) -> RankWork:
    return step_work(WholeStep("prefill", 1, tokens, 0, 0.0, "test"))[0]


def test_a_set_file_names_its_rows_beside_it_and_which_kinds_a_fit_uses(tmp_path):
    rows = [{"batch_size": 1, "input_len": 256, "output_len": 8, "prefill_latency": 0.02,
             "median_decode_latency": 0.006}]
    (ws,) = read_whole_step_sets(_set_file(tmp_path, rows, fit_kinds=["prefill"]))
    assert [(s.kind, s.tokens) for s in ws.steps] == [("prefill", 256), ("decode", 260)]
    assert [s.kind for s in ws.fitted_steps] == ["prefill"]
    assert ws.gpu.name == "h200" and ws.flags["disable-prefill-cuda-graph"] is True


@pytest.mark.parametrize("extra, key, message", [
    ({"fit": ["warmup"]}, "sets[0].fit", "prefill, decode"),
    ({"colour": "red"}, "sets[0]", "unknown colour"),
    ({"model": "no-such-model"}, "sets[0].model/gpu", "no-such-model"),
])
def test_a_bad_set_is_refused_naming_the_file_and_key(tmp_path, extra, key, message):
    rows = [{"kind": "prefill", "batch": 1, "new_tokens": 64, "seconds": 0.02}]
    fit_kinds = extra.pop("fit", None)
    path = _set_file(tmp_path, rows, fit_kinds=fit_kinds, **extra)
    with pytest.raises(ConfigError, match=message) as exc:
        read_whole_step_sets(path)
    assert exc.value.key == key and str(path) in str(exc.value)


def test_a_set_file_without_sets_is_refused(tmp_path):
    path = tmp_path / "sets.yaml"
    path.write_text("rows: x.jsonl\n")
    with pytest.raises(ConfigError, match="list under `sets`"):
        read_whole_step_sets(path)


def test_a_prefill_step_is_its_launch_or_its_kernels_whichever_is_longer():
    cal = load_calibration("h200")
    set_path(cal, ("overhead", "eager_prefill_per_layer_s"), 1.5e-3)  # 72 ms over 48 layers
    sm = _synthetic_trial(cal, n_windows=0).step_model(cal)
    launch = sm.eager_prefill_s
    kernels = lambda n: sm.gpu_time([_lone_prefill(n)], overheads=False)  # noqa: E731
    fixed = sm.prefill_batch_s + sm.dp_sync_s
    small, large = _lone_prefill(64), _lone_prefill(16384)
    assert kernels(64) < launch < kernels(16384)
    assert sm.gpu_time([small]) == pytest.approx(launch + fixed)  # launch-bound: flat in size
    assert sm.gpu_time([_lone_prefill(512)]) == pytest.approx(launch + fixed)
    assert sm.gpu_time([large]) == pytest.approx(kernels(16384) + sm.step_overhead_time(0) + fixed)
    # the launches run on the scheduler's thread: its other work in the step comes before them
    busy = sm.cpu_step_s + sm.per_req_s * 10
    assert sm.step_time([small], running=10) == pytest.approx(launch + busy + fixed)
    assert sm.step_time([large], running=10) == pytest.approx(sm.gpu_time([large]))


def test_block_fp8_weights_run_prefill_gemms_near_the_bf16_rate():
    cal = load_calibration("h200")
    sm = _synthetic_trial(cal, n_windows=0).step_model(cal)
    fp8 = _synthetic_trial(cal, n_windows=0)
    fp8.flags = {**FLAGS, "quantization": "fp8"}
    sm8 = fp8.step_model(cal)
    gpu = sm.gpu
    assert sm8._rate("fp8_block") == pytest.approx(gpu.bf16_tflops * 1e12 * cal["fp8_block_rate_vs_bf16"])
    assert sm8._rate("fp8_block") < gpu.fp8_tflops * 1e12
    # compute-bound: the fp8 linears of a long prefill take about as long as bf16's, not half (the
    # tables: the block-fp8 kernel at 0.34 of the fp8 peak, cuBLAS bf16 at 0.77 of the bf16 peak)
    ratio = sm8.linear_time(16384, 1) / sm.linear_time(16384, 1)
    assert 0.95 < ratio < 1.25


def _whole_steps_of(truth, tmp_path, tokens=(64, 256, 1024, 2048, 4096, 8192, 16384)):
    trial = _synthetic_trial(truth, n_windows=0)
    sm = trial.step_model(truth)
    rows = [{"kind": "prefill", "batch": 1, "new_tokens": n, "seconds": sm.gpu_time([_lone_prefill(n)])}
            for n in tokens]
    return read_whole_step_sets(_set_file(tmp_path, rows, flags=FLAGS))


def test_whole_steps_give_the_fit_the_prefill_the_windows_do_not_hold(tmp_path):
    base = load_calibration("h200")
    truth = copy.deepcopy(base)
    for path, v in TRUE.items():
        set_path(truth, path, v)
    set_path(truth, ("overhead", "eager_prefill_per_layer_s"), 1.5e-3)
    trial = _synthetic_trial(truth)
    sm = trial.step_model(truth)
    for w in trial.windows:  # decode only: the windows see no prefill
        w.prefills = []
        w.gen_tokens_per_s = w.gen_tokens / window_time(sm, w, trial.shared_prefix_tokens)
    sets = _whole_steps_of(truth, tmp_path)
    alone = fit([trial], calibration=base)
    both = fit([trial], calibration=base, whole_steps=sets)
    launch = ("overhead", "eager_prefill_per_layer_s")
    assert get_path(alone.calibration, launch) == pytest.approx(get_path(base, launch))  # unseen: the prior

    def fixed_s(cal):  # a lone step cannot split the launch from building the batch: their sum
        sm = trial.step_model(cal)
        return sm.eager_prefill_s + sm.prefill_batch_s

    assert fixed_s(both.calibration) == pytest.approx(fixed_s(truth), rel=0.1)
    assert fixed_s(alone.calibration) < 0.5 * fixed_s(truth)
    err = both.whole_steps[sets[0].label]
    assert err["mean_abs_error_prefill"] < 0.05 and err["mean_abs_error_decode"] is None
    assert whole_step_errors(sets[0], alone.calibration)["mean_abs_error"] > 0.2
    # the decode mechanism still comes from the windows
    assert get_path(both.calibration, ("memory_efficiency",)) == pytest.approx(TRUE[("memory_efficiency",)],
                                                                                rel=0.15)


def test_rows_of_a_kind_the_set_does_not_fit_do_not_move_the_fit(tmp_path):
    base = load_calibration("h200")
    trial = _synthetic_trial(base, n_windows=40)
    rows = [{"kind": "decode", "batch": 4, "context": 2000, "seconds": 1.0}]  # absurd: 1 s a decode step
    sets = read_whole_step_sets(_set_file(tmp_path, rows, flags=FLAGS, fit_kinds=["prefill"]))
    plain = fit([trial], calibration=base)
    with_rows = fit([trial], calibration=base, whole_steps=sets)
    assert with_rows.values == pytest.approx(plain.values)
    assert with_rows.whole_steps[sets[0].label]["mean_abs_error_decode"] > 0.9  # reported, not fitted
