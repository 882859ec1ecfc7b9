"""HiCache load-back measured on real SGLang: the host-to-GPU rate a server achieved, from its own
``/metrics`` over each load point (``sglang:load_back_tokens_total`` and the summed GPU time of the
load-back copies, ``sglang:load_back_duration_seconds_sum``, event to event on HiCache's load stream
while the forwards run), against the catalog's host link. This is what the step-time model's
``host_link_efficiency`` stands for (``StepTimeModel.host_bw``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.planner import plan_memory
from tuner.sim.measured import LoadPoint

TOKENS_KEY = "sglang:load_back_tokens_total"
SECONDS_KEY = "sglang:load_back_duration_seconds_sum"
COUNT_KEY = "sglang:load_back_duration_seconds_count"


@dataclass(frozen=True)
class LoadBackSample:
    """One load point's load-back: tokens, the copies' summed GPU time, and the rate they imply."""

    label: str
    gpu: str
    kv_cache_dtype: str
    kv_bytes_per_token: int  # one GPU's KV cell (all layers, K and V)
    loads: int
    tokens: int
    seconds: float
    host_link_gbps: float  # the catalog's figure for the GPU

    @property
    def gbps(self) -> float:
        return self.tokens * self.kv_bytes_per_token / self.seconds / 1e9

    @property
    def efficiency(self) -> float:
        return self.gbps / self.host_link_gbps

    def to_dict(self) -> dict:
        return {**asdict(self), "gbps": round(self.gbps, 3), "efficiency": round(self.efficiency, 4)}


def load_back_counters(sm: dict | None) -> dict | None:
    """A HiCache server's load-back over a load point from its ``/metrics`` delta: tokens, loads
    and the copies' summed GPU time (0 where the labelled counters never moved, as Prometheus
    exports them only once incremented); None where the metrics are not a HiCache server's."""
    sm = sm or {}
    if not any(k.startswith("sglang:hicache_") or k == TOKENS_KEY for k in sm):
        return None
    return {"load_back_tokens": int(sm.get(TOKENS_KEY) or 0), "loads": int(sm.get(COUNT_KEY) or 0),
            "seconds": float(sm.get(SECONDS_KEY) or 0.0)}


def load_back_samples(points: Iterable[LoadPoint], *, min_tokens: int = 10_000) -> list[LoadBackSample]:
    """The load points whose server loaded at least ``min_tokens`` back from host memory (smaller
    ones are mostly the copies' launch latency). The KV cell is the planner's for the point's
    configuration, which matches SGLang's own pool accounting (``tuner bench planner``)."""
    out = []
    for p in points:
        c = load_back_counters(p.server_metrics)
        if c is None or c["load_back_tokens"] < min_tokens or c["seconds"] <= 0:
            continue
        gpu = get_gpu(p.gpu)
        plan = plan_memory(get_model(p.model), gpu, p.gpus, p.flags, nodes=p.nodes,
                           sglang_version=p.sglang_version)
        out.append(LoadBackSample(label=p.label, gpu=gpu.name, kv_cache_dtype=plan.kv_cache_dtype,
                                  kv_bytes_per_token=plan.bytes_per_token, loads=c["loads"],
                                  tokens=c["load_back_tokens"], seconds=c["seconds"],
                                  host_link_gbps=gpu.host_link_gbps))
    return out


def pooled_efficiency(samples: list[LoadBackSample]) -> float:
    """All bytes over all copy time, as a share of the link: each point weighted by its traffic."""
    if not samples:
        raise ConfigError("no load point with HiCache load-back in the data (sglang:load_back_tokens_total; "
                          "a HiCache server whose device pool evicts, with --enable-metrics)", key="--results")
    moved = sum(s.tokens * s.kv_bytes_per_token for s in samples)
    link_s = sum(s.seconds * s.host_link_gbps * 1e9 for s in samples)
    return moved / link_s
