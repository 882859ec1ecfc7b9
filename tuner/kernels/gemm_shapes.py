"""The fp8 block-quantized linear layers of a model on one GPU: (N, K) of each ``w8a8_block_fp8_matmul``.

SGLang runs every fp8-block ``LinearBase`` through ``w8a8_block_fp8_matmul(A[M, K], B[N, K])`` and looks
its tile config up by (N, K) of the *partitioned* weight. Partitioning follows SGLang's linear layers:

* ColumnParallel / MergedColumnParallel / QKVParallel split N by the attention (or MLP) TP size; KV
  heads are replicated when TP exceeds their count (``max(1, kv_heads / tp)`` per GPU);
* RowParallel splits K;
* MLA's ``q_a_proj`` and ``kv_a_proj_with_mqa`` are replicated (full N and K on every GPU).

Routed experts are not here (they run in the fused-MoE kernel); a shared expert is, unless SGLang
fuses it into the routed experts. Embeddings, lm_head, routers and the DSA indexer stay unquantized.
Pure CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog import get_model
from tuner.errors import ConfigError
from tuner.kernels.shapes import SHARED_FUSION_ARCHITECTURES

BLOCK_SHAPE = (128, 128)


@dataclass(frozen=True, order=True)
class GemmShape:
    """One block-fp8 GEMM as SGLang's Triton kernel sees it: C[M, N] = A[M, K] @ B[N, K]^T."""

    N: int
    K: int
    block_shape: tuple[int, int] = BLOCK_SHAPE

    def __post_init__(self):
        if self.N <= 0 or self.K <= 0:
            raise ConfigError(f"GEMM N={self.N}, K={self.K} must be positive", key="gemm_shape")
        bn, bk = self.block_shape
        if bn <= 0 or bk <= 0:
            raise ConfigError(f"block_shape {list(self.block_shape)} must be positive", key="block_shape")

    @property
    def tag(self) -> str:
        return f"N{self.N}_K{self.K}_fp8_b{self.block_shape[0]}x{self.block_shape[1]}"

    def to_dict(self) -> dict:
        return {"N": self.N, "K": self.K, "block_shape": list(self.block_shape)}

    @classmethod
    def from_dict(cls, d: dict) -> GemmShape:
        return cls(int(d["N"]), int(d["K"]), tuple(d.get("block_shape") or BLOCK_SHAPE))


@dataclass(frozen=True)
class LinearLayer:
    name: str  # SGLang's module name, e.g. "qkv_proj"
    shape: GemmShape
    count: int  # layers of the model that have it (for weighting)


def _split(total: int, parts: int, what: str, key: str) -> int:
    if total % parts:
        raise ConfigError(f"{what} {total} is not divisible by {parts}", key=key)
    return total // parts


def linear_layers(model: str, tp_size: int, *, attn_tp_size: int | None = None,
                  disable_shared_experts_fusion: bool = False,
                  block_shape: tuple[int, int] = BLOCK_SHAPE) -> list[LinearLayer]:
    """Every distinct block-fp8 linear layer of ``model`` on one GPU at this parallelism."""
    spec = get_model(model)
    if tp_size < 1:
        raise ConfigError(f"tp_size must be >= 1, got {tp_size}", key="tp_size")
    atp = attn_tp_size or tp_size
    if atp < 1 or tp_size % atp:
        raise ConfigError(f"attention TP size {atp} must divide tp_size {tp_size}", key="attn_tp_size")
    h = spec.hidden_size
    out: list[LinearLayer] = []

    bn, bk = block_shape

    def add(name, n, k, count, split_n=1, split_k=1):
        # SGLang's block-fp8 linear refuses a TP partition that is not whole weight blocks
        if split_n > 1 and n % bn:
            raise ConfigError(f"{name}: output partition {n} is not a multiple of block_n {bn} at this TP",
                              key="tp_size")
        if split_k > 1 and k % bk:
            raise ConfigError(f"{name}: input partition {k} is not a multiple of block_k {bk} at this TP",
                              key="tp_size")
        out.append(LinearLayer(name, GemmShape(n, k, tuple(block_shape)), count))

    L = spec.num_layers
    if spec.is_mla:
        heads = _split(spec.num_attention_heads, atp, "attention heads", "tp_size")
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            add("q_a_proj", spec.q_lora_rank, h, L)
            add("q_b_proj", heads * qk, spec.q_lora_rank, L, split_n=atp)
        else:
            add("q_proj", heads * qk, h, L, split_n=atp)
        add("kv_a_proj_with_mqa", spec.kv_lora_rank + spec.qk_rope_head_dim, h, L)
        add("kv_b_proj", heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank, L, split_n=atp)
        add("o_proj", h, heads * spec.v_head_dim, L, split_k=atp)
    else:
        hd = spec.head_dim or h // spec.num_attention_heads
        heads = _split(spec.num_attention_heads, atp, "attention heads", "tp_size")
        kv = max(1, spec.num_kv_heads // atp)
        add("qkv_proj", (heads + 2 * kv) * hd, h, L, split_n=atp)
        add("o_proj", h, heads * hd, L, split_k=atp)
    dense = spec.first_k_dense if spec.is_moe else L
    if dense and spec.intermediate_size:
        inter = _split(spec.intermediate_size, tp_size, "intermediate_size", "tp_size")
        add("gate_up_proj", 2 * inter, h, dense, split_n=tp_size)
        add("down_proj", h, inter, dense, split_k=tp_size)
    fused = spec.architecture in SHARED_FUSION_ARCHITECTURES and not disable_shared_experts_fusion
    if spec.is_moe and spec.n_shared_experts and not fused:
        inter = _split(spec.moe_intermediate_size * spec.n_shared_experts, tp_size, "shared-expert size",
                       "tp_size")
        add("shared_experts.gate_up_proj", 2 * inter, h, spec.num_moe_layers, split_n=tp_size)
        add("shared_experts.down_proj", h, inter, spec.num_moe_layers, split_k=tp_size)
    return out


def gemm_shapes(model: str, tp_size: int, **kw) -> list[GemmShape]:
    """The distinct (N, K) of ``linear_layers``, in first-seen order."""
    return list(dict.fromkeys(layer.shape for layer in linear_layers(model, tp_size, **kw)))
