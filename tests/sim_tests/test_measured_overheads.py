"""Step overheads measured directly, not fitted: the scheduler's CPU per decode step (a server of
the studies' flags with 2 of Qwen3-30B-A3B's 48 layers, ``results/h100-sglang/sched_probe.py``;
--enable-metrics adds to it per running request), and the sampler's time (operator tables)."""

import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest

from tuner.sim.calibrate import load_calibration
from tuner.sim.steptime import RankWork

from tests.sim_tests.stepmodels import server_step_model

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "results" / "h100-sglang" / "sched-probe"
THIN = {"name": "qwen3-30b-a3b", "overrides": {"num_hidden_layers": 2}}


def _probe_module():
    spec = importlib.util.spec_from_file_location("sched_probe", ROOT / "results/h100-sglang/sched_probe.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _step_model(model, gpu: str, flags: dict):
    """The simulator's step model of a server with exactly these flags (its calibration context's values)."""
    return server_step_model(model, gpu, flags, base={})


def test_enable_metrics_adds_its_cost_per_running_request():
    flags = {"attention-backend": "triton", "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3"}
    off = _step_model(THIN, "h100", flags)
    on = _step_model(THIN, "h100", {**flags, "enable-metrics": True})
    per_req = load_calibration("h100")["overhead"]["metrics_per_request_s"]
    assert per_req > 0
    assert on.cpu_step_s == off.cpu_step_s
    assert on.per_req_s == pytest.approx(off.per_req_s + per_req)
    # at 96 requests the 2-layer server is CPU-bound: the metrics' share shows in its step
    w = RankWork(decode_reqs=96, decode_ctx_tokens=96 * 144, decode_max_ctx_tokens=144, decode_min_ctx_tokens=144)
    assert on.step_time([w], 96) - off.step_time([w], 96) == pytest.approx(96 * per_req, rel=0.05)


def test_the_committed_calibration_predicts_the_probes_cpu_bound_steps():
    """Every committed round of the 2-layer server (1-96 requests, with and without metrics): the
    simulator's step, with the calibration a study's server gets, within the probe's own spread.
    A floor fitted to the 48-layer studies' windows (4.8 ms + 0.16 ms a request, once committed)
    is 3-10x long here."""
    probe = _probe_module()
    errors = {"metrics": [], "off": []}
    for path in sorted(PROBES.glob("sched-probe*.json")) + sorted(PROBES.glob("calls-*/sched-probe*.json")):
        doc = json.loads(path.read_text())
        metrics = doc["flags"].get("enable-metrics") is True
        for row in doc["rows"]:
            if row["server"] != "thin":
                continue
            measured = probe.steady_step_ms(row)
            if measured != measured:  # a round that outgrew the running limit (a queue)
                continue
            sim, _ = probe.predicted_ms(row["layers"], row["concurrency"], doc.get("gpu", "h100"),
                                        row.get("prompt_tokens", 64), doc["flags"])
            errors["metrics" if metrics else "off"].append(abs(math.log(sim / measured)))
    assert len(errors["metrics"]) >= 15 and len(errors["off"]) >= 25
    for kind, errs in errors.items():
        assert statistics.median(errs) < 0.2, kind  # the rounds themselves differ by 10-40% at one load
        assert max(errs) < 0.6, kind


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_sampling_follows_the_measured_sampler_fixed_and_per_sequence(gpu):
    """SGLang's pytorch sampler timed alone (tuner profile, op sampling): a fixed part, then each
    sequence's fp32 logits read a few times at the HBM's rate; the same two values on both GPUs."""
    table = json.loads((ROOT / f"results/profiles/{gpu}/tables/qwen3-30b-a3b-tp1-fp8-fp8kv-triton-0.5.17.json")
                       .read_text())
    op = next(o for o in table["ops"] if o["op"] == "sampling")
    sm = _step_model("qwen3-30b-a3b", gpu, {"attention-backend": "triton"})
    errs = [abs(sm.sampling_time(b) / (us * 1e-6) - 1) for b, us in zip(op["grid"]["batch"], op["us"])]
    assert max(errs) < 0.2 and statistics.mean(errs) < 0.1
    # grows with the batch as the table does (a constant would be 10x off at 512 sequences)
    assert sm.sampling_time(op["grid"]["batch"][-1]) > 5 * sm.sampling_time(1)
