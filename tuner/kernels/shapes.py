"""Expert shape (E, N, K) of a model's fused-MoE layer under a given parallelism.

Follows SGLang's tuning script (benchmark/kernels/fused_moe_triton/common_utils.py::get_model_config):
E = routed experts per EP rank, plus the shared expert when SGLang fuses it into the routed-expert
tensor; N = w2.shape[2] = moe_intermediate_size / moe_tp (moe_tp = tp / ep); K = hidden_size.
Pure CPU: no torch, no triton.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tuner.catalog import get_model
from tuner.errors import ConfigError

# Architectures whose shared expert SGLang fuses into the routed experts (one extra expert slot,
# E = n_routed/ep + 1) unless --disable-shared-experts-fusion is given.
SHARED_FUSION_ARCHITECTURES = frozenset({
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "MistralLarge3ForCausalLM",
})

DTYPES = ("bf16", "fp8_w8a8")
#: checkpoint weight format -> (dtype, block shape) of SGLang's Triton fused-MoE kernel for it;
#: other formats (nvfp4, ...) run other kernels and read no Triton tile file
TRITON_MOE_DTYPES: dict[str, tuple[str, tuple[int, int] | None]] = {
    "bf16": ("bf16", None),
    "fp8_block": ("fp8_w8a8", (128, 128)),
}


@dataclass(frozen=True)
class MoEShape:
    """One fused-MoE layer as the Triton kernel sees it on one GPU."""

    num_experts: int  # E: local experts, fused shared expert included
    intermediate: int  # N: per-GPU intermediate size (w2.shape[2]); w1 is [E, 2N, K]
    hidden: int  # K: hidden size
    topk: int
    dtype: str  # "bf16" | "fp8_w8a8"
    block_shape: tuple[int, int] | None = None  # fp8 block-wise weight quantisation [block_n, block_k]
    fused_shared_experts: int = 0  # shared experts fused in as extra expert slots (each token picks them)
    ep_size: int = 1  # expert parallelism: > 1 makes SGLang's kernels filter non-local experts

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}", key="dtype")
        if self.block_shape is not None:
            if self.dtype != "fp8_w8a8":
                raise ConfigError("block_shape applies only to dtype fp8_w8a8", key="block_shape")
            bn, bk = self.block_shape
            if bn <= 0 or bk <= 0 or self.hidden % bk or self.intermediate % bk:
                raise ConfigError(
                    f"block_shape {list(self.block_shape)} must be positive and block_k must divide "
                    f"K={self.hidden} and N={self.intermediate}", key="block_shape")
        if self.fused_shared_experts < 0 or self.fused_shared_experts >= self.topk:
            raise ConfigError(f"fused_shared_experts={self.fused_shared_experts} must be >= 0 and below "
                              f"topk={self.topk}", key="fused_shared_experts")
        if self.ep_size < 1:
            raise ConfigError(f"ep_size must be >= 1, got {self.ep_size}", key="ep_size")
        for name in ("num_experts", "intermediate", "hidden", "topk"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}", key=name)
        if self.topk > self.num_experts:
            raise ConfigError(f"topk={self.topk} exceeds E={self.num_experts}", key="topk")

    @property
    def routed_topk(self) -> int:
        """Experts a token's router picks (the fused shared experts come on top)."""
        return self.topk - self.fused_shared_experts

    @property
    def routed_experts(self) -> int:
        """Local expert slots the router chooses among (the fused shared slots are the last ones)."""
        return self.num_experts - self.fused_shared_experts

    @property
    def expert_weight_bytes(self) -> int:
        """One expert's gate/up and down weights (fp8: 1 byte an element, bf16: 2)."""
        return 3 * self.intermediate * self.hidden * (1 if self.dtype == "fp8_w8a8" else 2)

    def touched_weight_bytes(self, M: int) -> float:
        """Expected expert weights one call reads at M tokens under uniform routing: the routed
        experts hit at least once (each token picks routed_topk of them) plus the fused shared ones."""
        miss = (1 - self.routed_topk / self.routed_experts) ** M
        return (self.routed_experts * (1 - miss) + self.fused_shared_experts) * self.expert_weight_bytes

    def timing_rotations(self, M: int, l2_bytes: int, most: int = 8) -> int:
        """Routing draws a timing cycles through: ``most`` while one call's weights could stay in L2
        for the next (small M), 2 once a call reads at least twice the L2 (large M, where more draws
        only lengthen every replay: DeepSeek-V3's M=4096 spent 100 s replaying 8 draws)."""
        return 2 if self.touched_weight_bytes(M) >= 2 * l2_bytes else most

    @property
    def tag(self) -> str:
        """A short file-name-safe label: E_N_K_dtype."""
        bs = f"_b{self.block_shape[0]}x{self.block_shape[1]}" if self.block_shape else ""
        return f"E{self.num_experts}_N{self.intermediate}_K{self.hidden}_{self.dtype}{bs}"

    @property
    def config_dtype(self) -> str | None:
        """The dtype part of SGLang's config-file name (None for bf16)."""
        return None if self.dtype == "bf16" else self.dtype

    def to_dict(self) -> dict:
        d = asdict(self)
        d["block_shape"] = list(self.block_shape) if self.block_shape else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MoEShape:
        bs = d.get("block_shape")
        return cls(num_experts=d["num_experts"], intermediate=d["intermediate"], hidden=d["hidden"],
                   topk=d["topk"], dtype=d["dtype"], block_shape=tuple(bs) if bs else None,
                   fused_shared_experts=int(d.get("fused_shared_experts", 0)), ep_size=int(d.get("ep_size", 1)))


def parse_block_shape(text: str | None) -> tuple[int, int] | None:
    """'128,128' -> (128, 128); '' / 'none' / None -> None."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return None
    parts = [p.strip() for p in str(text).replace("[", "").replace("]", "").split(",") if p.strip()]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"block shape {text!r} is not two integers like 128,128", key="block_shape") from None
    if len(values) != 2:
        raise ConfigError(f"block shape {text!r} needs exactly two integers (block_n,block_k)", key="block_shape")
    return values  # type: ignore[return-value]


def moe_shape(model, tp_size: int, ep_size: int = 1, dtype: str = "bf16",
              block_shape: tuple[int, int] | None = None,
              disable_shared_experts_fusion: bool = False) -> MoEShape:
    """The (E, N, K) a model's MoE layer has on one GPU at tp_size / ep_size (``model``: a catalog
    name or a ``ModelDescription``, an overridden one included)."""
    spec = get_model(model)
    if not spec.is_moe:
        raise ConfigError(f"model {spec.name!r} has no MoE layers", key="model")
    if tp_size < 1 or ep_size < 1:
        raise ConfigError(f"tp_size and ep_size must be >= 1 (got {tp_size}, {ep_size})", key="tp_size")
    if tp_size % ep_size:
        raise ConfigError(f"ep_size={ep_size} must divide tp_size={tp_size}", key="ep_size")
    moe_tp = tp_size // ep_size
    if spec.moe_intermediate_size % moe_tp:
        raise ConfigError(f"moe_intermediate_size {spec.moe_intermediate_size} is not divisible by "
                          f"moe-TP {moe_tp} (tp/ep)", key="tp_size")
    if spec.n_routed_experts % ep_size:
        raise ConfigError(f"{spec.n_routed_experts} routed experts are not divisible by ep_size={ep_size}",
                          key="ep_size")
    fused = (spec.architecture in SHARED_FUSION_ARCHITECTURES and not disable_shared_experts_fusion
             and spec.n_shared_experts > 0)
    shared = spec.n_shared_experts if fused else 0
    # SGLang (models/deepseek_v2.py): num_experts = n_routed + fused shared, top_k = experts_per_token +
    # fused shared; the last top-k column always names a shared slot.
    experts = spec.n_routed_experts // ep_size + shared
    return MoEShape(num_experts=experts, intermediate=spec.moe_intermediate_size // moe_tp,
                    hidden=spec.hidden_size, topk=spec.experts_per_token + shared, dtype=dtype,
                    block_shape=tuple(block_shape) if block_shape else None, fused_shared_experts=shared,
                    ep_size=ep_size)
