"""A tiny GLM-5.1 study (a handful of configurations, short simulated windows) for fast tests."""

from __future__ import annotations

from pathlib import Path

import yaml

TINY_SPACE = {
    "name": "tiny-bench",
    "engine": "sglang",
    "params": {
        "tp-size": {"values": [8]},
        "attn-dp-size": {"values": [1, 8]},
        "kv-cache-dtype": {"values": [None, "fp8_e4m3"]},
        "router-policy": {"values": [None, "cache_aware"], "condition": "attn_dp_size > 1"},
        "quantization": {"values": ["modelopt_fp4"]},
    },
    "constraints": ["tp_size % attn_dp_size == 0"],
}


def write_tiny_study(tmp_path: Path, *, name: str = "tiny", space: dict | None = None, max_users: int = 16,
                     sampler: str = "default", trials: int = 4, bisect: str | None = None) -> Path:
    data = {
        "name": name, "model": "glm-5.1",
        "hardware": {"gpu": "h200", "gpus_per_node": 8, "nodes": 1, "host_memory_gb": 2048},
        "workload": "coding-agent", "search_space": space or TINY_SPACE,
        "slo": {"p90_ttft_s": 30.0, "p90_tpot_s": 0.05}, "target_users": min(8, max_users),
        "capacity": {"start_users": 4, "max_users": max_users, "resolution_users": 4},
        "measurement": {"warmup_s": 10, "duration_s": 30},
        "baseline": {"tp-size": 8, "quantization": "modelopt_fp4"},
        "trials": trials, "sampler": sampler, "backend": "simulator",
    }
    if bisect is not None:
        data["capacity"]["bisect"] = bisect
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p
