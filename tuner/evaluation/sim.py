"""Simulator backend: a trial is a simulated deployment measured by tuner.sim (no GPUs)."""

from __future__ import annotations

from tuner.errors import ConfigError, TrialError
from tuner.evaluation.base import Deployment, Evaluator, TrialRequest
from tuner.lifecycle import FailureClass
from tuner.planner import plan_memory
from tuner.sim import simulate_load_point
from tuner.catalog.routing import random_weight_flags
from tuner.vocabulary import BackendKind
from tuner.workload.metrics import LoadPointMetrics


class SimDeployment(Deployment):
    def __init__(self, request: TrialRequest, plan):
        self.request = request
        self.plan = plan
        self.predicted_kv_capacity_tokens_total = plan.kv_capacity_tokens_total
        self.measured_kv_capacity_tokens_total = plan.kv_capacity_tokens_total
        self.measurements = 0

    def measure(self, users: int) -> LoadPointMetrics:
        study, req = self.request.study, self.request
        hw = study.hardware
        options = getattr(study, "backend_options", None) or {}
        index = self.measurements
        self.measurements += 1
        m = study.measurement
        warmup_s = m.warmup_for(index)
        # the deployment's first load point is its server's first traffic (the warm-up a real
        # trial gives it, and the fresh-server stalls where they were measured)
        return simulate_load_point(
            study.model, hw.gpu, hw.gpus_per_node, {**random_weight_flags(options), **req.flags}, req.knobs,
            study.workload_profile(), users,
            warmup_s=warmup_s, duration_s=m.duration_s,
            seed=req.seed, nodes=hw.nodes, host_memory_gb=hw.host_memory_gb, calibration=options.get("calibration"),
            sglang_version=options.get("sglang_version"), fresh_server=m.fresh_kernels(index),
        )

    def telemetry(self) -> dict:
        return {"backend": BackendKind.SIMULATOR.value, "plan": self.plan.to_dict()}


class SimEvaluator(Evaluator):
    kind = BackendKind.SIMULATOR
    windows_take_wall_time = False

    def gpus_needed(self, request: TrialRequest) -> int:
        return 0

    def deploy(self, request: TrialRequest) -> Deployment:
        hw = request.study.hardware
        try:
            plan = plan_memory(request.study.model, hw.gpu, hw.gpus_per_node, request.flags, nodes=hw.nodes,
                               host_memory_gb=hw.host_memory_gb,
                               sglang_version=(getattr(request.study, "backend_options", None) or {}).get(
                                   "sglang_version"))
        except ConfigError as exc:
            raise TrialError(FailureClass.INFEASIBLE, str(exc)) from None
        if not plan.fits:
            raise TrialError(plan.failure_class, plan.reason)
        return SimDeployment(request, plan)
