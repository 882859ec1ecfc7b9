"""What models and GPUs are: the records the catalog, a model's config.json and every consumer share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from tuner.errors import ConfigError

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


class GPUDescription(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    display_name: str
    torch_name: str
    memory_mib: int
    torch_total_memory_bytes: int | None = None
    # free device memory when SGLang starts loading the weights on a one-GPU server (its log's
    # "Load weight begin. avail mem=..."), where measured: the CUDA context and workspaces taken
    sglang_pre_load_free_bytes: int | None = None
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
