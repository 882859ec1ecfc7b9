"""Catalog of models and GPUs, read from the YAML data files beside this module.

``get_model("glm-5.1")`` and ``get_gpu("h200")`` return frozen pydantic records; unknown names
raise ConfigError listing the valid ones (with a did-you-mean).
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError

_DATA = Path(__file__).parent

ModuleKind = Literal[
    "attention", "dense_mlp", "shared_expert", "routed_experts", "embedding", "lm_head",
    "router", "indexer", "mtp", "norms",
]


class Checkpoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    hf_id: str
    sglang_quantization: str | None
    weight_format: Literal["bf16", "fp8_block", "nvfp4"]
    unquantized: tuple[ModuleKind, ...] = ()


class ModelDescription(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    display_name: str
    hf_id: str
    architecture: str
    attention: Literal["mla", "dsa", "gqa"]
    hidden_size: int
    num_layers: int
    first_k_dense: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # gqa
    q_lora_rank: int | None = None  # mla / dsa
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    experts_per_token: int
    index_n_heads: int | None = None  # dsa
    index_head_dim: int | None = None
    index_topk: int | None = None
    mtp_layers: int = 0
    vocab_size: int
    tie_word_embeddings: bool = False
    max_context_tokens: int
    unverified: bool = False
    checkpoints: dict[str, Checkpoint]

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense if self.is_moe else 0

    @property
    def is_mla(self) -> bool:
        return self.attention in ("mla", "dsa")

    def checkpoint(self, quantization: str) -> Checkpoint:
        if quantization not in self.checkpoints:
            raise ConfigError(
                f"model {self.name!r} has no {quantization!r} checkpoint; valid: {sorted(self.checkpoints)}",
                key="quantization",
            )
        return self.checkpoints[quantization]


class GPUDescription(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    display_name: str
    torch_name: str
    memory_mib: int
    torch_total_memory_bytes: int | None = None
    memory_bandwidth_gbps: float
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float | None = None
    sm_count: int
    sm_version: int
    l2_cache_mib: float
    interconnect: str
    interconnect_gbps: float
    host_link_gbps: float
    unverified: bool = False

    @property
    def memory_bytes(self) -> int:
        """Usable device memory in bytes as torch reports it (nvidia-smi total less ~615 MiB)."""
        if self.torch_total_memory_bytes:
            return self.torch_total_memory_bytes
        return (self.memory_mib - 615) * 2**20

    @property
    def device_name(self) -> str:
        """The name SGLang puts into MoE config file names (torch name, spaces -> _)."""
        return self.torch_name.replace(" ", "_")


@lru_cache(maxsize=None)
def _raw(kind: str) -> dict:
    with open(_DATA / f"{kind}.yaml") as f:
        return yaml.safe_load(f)


@lru_cache(maxsize=None)
def models() -> dict[str, ModelDescription]:
    raw = _raw("models")
    out: dict[str, ModelDescription] = {}
    for name, entry in raw.items():
        entry = dict(entry)
        base = entry.pop("same_as", None)
        if base:
            merged = dict(raw[base])
            merged.update(entry)
            entry = merged
        out[name] = ModelDescription(name=name, **entry)
    return out


@lru_cache(maxsize=None)
def gpus() -> dict[str, GPUDescription]:
    return {name: GPUDescription(name=name, **entry) for name, entry in _raw("gpus").items()}


def _suggest(name: str, valid) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; valid: {', '.join(sorted(valid))}"


def get_model(name: str) -> ModelDescription:
    table = models()
    key = name.lower()
    if key not in table:
        raise ConfigError(f"unknown model {name!r}{_suggest(key, table)}", key="model")
    return table[key]


def get_gpu(name: str) -> GPUDescription:
    table = gpus()
    key = name.lower()
    if key not in table:
        raise ConfigError(f"unknown GPU {name!r}{_suggest(key, table)}", key="hardware.gpu")
    return table[key]
