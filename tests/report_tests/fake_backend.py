"""A deterministic stand-in backend so report tests run the real study driver in seconds.

Latency follows a simple queueing shape: TTFT stays flat until the KV pool fills (set by
attention-DP, KV dtype and the hierarchical cache) and then climbs steeply; TPOT grows with
users. Trial 2 always fails with an out-of-memory error whose reason holds markup, and writes a
server log inside its trial directory, so escaping and log serving are exercised; trial 10 is
refused by the server as an invalid combination (infeasible), so the report shows two failure
classes whatever the sampler tries.
"""

from __future__ import annotations

from tuner.errors import TrialError
from tuner.evaluation import registry
from tuner.evaluation.base import Deployment, Evaluator, TrialRequest
from tuner.evaluation.live import trial_dir_for
from tuner.workload.metrics import LoadPointMetrics

KIND = "reportfake"
HOSTILE_REASON = "<script>window.__pwned=1</script> CUDA out of memory & <b>bold</b>"


def register() -> None:
    registry._KINDS[KIND] = f"{__name__}:FakeEvaluator"


class FakeDeployment(Deployment):
    def __init__(self, request: TrialRequest):
        f = request.flags
        dp = f.get("attn-dp-size") or 1
        kv = 2.0 if f.get("kv-cache-dtype") == "fp8_e4m3" else 1.0
        hi = 1.5 if f.get("enable-hierarchical-cache") else 1.0
        self.knee_users = 12 * dp * kv * hi
        self.tpot_base_s = 0.018 if f.get("quantization") == "modelopt_fp4" else 0.024
        self.predicted_kv_capacity_tokens_total = int(150_000 * dp * kv)
        self.measured_kv_capacity_tokens_total = int(self.predicted_kv_capacity_tokens_total * 0.93)
        log = trial_dir_for(request) / "server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"server started with {sorted(f.items())}\n")
        self.log_path = str(log)

    def measure(self, users: int) -> LoadPointMetrics:
        over = max(0.0, users / self.knee_users - 1.0)
        p90_ttft = 1.5 + 4.0 * users / self.knee_users + 80.0 * over ** 2
        p90_tpot = self.tpot_base_s * (1 + users / 80)
        return LoadPointMetrics(
            users=users, requests=20 * users, errors=0, duration_s=240.0,
            p50_ttft_s=p90_ttft * 0.5, p90_ttft_s=p90_ttft, p99_ttft_s=p90_ttft * 1.6,
            p50_tpot_s=p90_tpot * 0.8, p90_tpot_s=p90_tpot, p99_tpot_s=p90_tpot * 1.3,
            p50_itl_s=p90_tpot * 0.7, p90_itl_s=p90_tpot, p99_itl_s=p90_tpot * 1.4, p90_e2e_s=p90_ttft + 300 * p90_tpot,
            throughput_tokens_per_s=users / p90_tpot * 0.6, input_throughput_tokens_per_s=users * 900.0,
            prefix_cache_hit_rate=min(0.95, 0.6 + 0.05 * self.knee_users / max(users, 1)),
            kv_capacity_tokens_total=self.measured_kv_capacity_tokens_total)


class FakeEvaluator(Evaluator):
    kind = KIND

    def deploy(self, request: TrialRequest) -> Deployment:
        if request.trial_number == 2:
            log = trial_dir_for(request) / "server.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("loading weights\ntorch.OutOfMemoryError: CUDA out of memory <script>x</script>\n")
            raise TrialError("oom", HOSTILE_REASON, log_path=str(log))
        if request.trial_number == 10:
            raise TrialError("infeasible", "the server refused this combination of flags")
        return FakeDeployment(request)
