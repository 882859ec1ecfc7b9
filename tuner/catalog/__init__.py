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


class ModelSpec(BaseModel):
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
    hf_config_json: str | None = None  # the config.json it was read from (None: a catalog entry)

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


class GPUSpec(BaseModel):
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
def models() -> dict[str, ModelSpec]:
    raw = _raw("models")
    out: dict[str, ModelSpec] = {}
    for name, entry in raw.items():
        entry = dict(entry)
        base = entry.pop("same_as", None)
        if base:
            merged = dict(raw[base])
            merged.update(entry)
            entry = merged
        out[name] = ModelSpec(name=name, **entry)
    return out


@lru_cache(maxsize=None)
def gpus() -> dict[str, GPUSpec]:
    return {name: GPUSpec(name=name, **entry) for name, entry in _raw("gpus").items()}


def _suggest(name: str, valid) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; valid: {', '.join(sorted(valid))}"


def get_model(ref) -> ModelSpec:
    """The model a study names: a catalog name, a directory holding a config.json, a
    ``ModelRef`` (name + overrides), or a ``ModelSpec`` (returned as it is)."""
    from tuner.catalog.hf import ModelRef, model_for_ref, model_from_hf_config, read_config_dir

    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, ModelRef):
        return _model_for_ref_json(ref.model_dump_json())
    if isinstance(ref, dict):
        return _model_for_ref_json(ModelRef.model_validate(ref).model_dump_json())
    name = str(ref)
    table = models()
    key = name.lower()
    if key in table:
        return table[key]
    if "/" in name or name.startswith(".") or Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
        if path.is_dir():
            return model_from_hf_config(read_config_dir(path), name=str(path.resolve()), hf_id=str(path.resolve()))
        if not (path / "config.json").exists() and "/" in name and not name.startswith((".", "/", "~")):
            pass  # an "org/name" hub id: not a catalog name either; fall through to the error
    raise ConfigError(f"unknown model {name!r}{_suggest(key, table)}, and not a directory holding a "
                      f"config.json", key="model")


@lru_cache(maxsize=256)
def _model_for_ref_json(ref_json: str) -> ModelSpec:
    from tuner.catalog.hf import ModelRef, model_for_ref

    return model_for_ref(ModelRef.model_validate_json(ref_json))


def model_label(ref) -> str:
    """How a study's model reads in messages and headers."""
    from tuner.catalog.hf import ModelRef

    if isinstance(ref, ModelRef):
        return ref.label
    return str(ref)


def get_gpu(name: str) -> GPUSpec:
    table = gpus()
    key = name.lower()
    if key not in table:
        raise ConfigError(f"unknown GPU {name!r}{_suggest(key, table)}", key="hardware.gpu")
    return table[key]
