"""What ``tuner profile`` measures for one configuration: every operator one GPU runs (shapes from
``tuner.sim.opshapes``, so the simulator finds the tables again) over a grid of sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.catalog import Checkpoint, GPUDescription, ModelDescription
from tuner.planner.parallel import ParallelLayout
from tuner.sim.opshapes import (AttentionShape, Gemm, HostWriteShape, MoEShape, attention_shape, gemms,
                                host_write_shape, moe_shape)
from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.planner import parse_layout, resolve_checkpoint
from tuner.planner.memory import kv_cache_dtype, page_size
from tuner.planner.startup import default_attention_backend
from tuner.catalog.routing import routed_expert_pool
from tuner.sim.scheduler import check_version

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXT = (256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
NEW_TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192)
PREFIX = (0, 1024, 4096, 16384, 32768, 65536, 131072)
QUICK = {"tokens": (1, 8, 64, 512, 4096), "batch": (1, 8, 64, 256), "context": (1024, 8192, 32768),
         "new_tokens": (64, 1024, 8192), "prefix": (0, 4096, 32768)}
# the forward's operators (timed on the GPU), timed unless --ops names others
DEFAULT_OPS = ("gemm", "decode_attention", "extend_attention", "moe", "layer_misc", "sampling")
# hicache_write: the scheduler thread's CPU time to issue one HiCache write-through backup
OP_KINDS = (*DEFAULT_OPS, "hicache_write")
WRITE_TOKENS = (1, 16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class ProfilePlan:
    model: ModelDescription
    gpu: GPUDescription
    ckpt: Checkpoint
    layout: ParallelLayout
    kv_cache_dtype: str
    attention_backend: str
    sglang_version: str
    flags: dict
    ops: tuple[str, ...] = DEFAULT_OPS
    tokens: tuple[int, ...] = TOKENS
    batch: tuple[int, ...] = BATCH
    context: tuple[int, ...] = CONTEXT
    new_tokens: tuple[int, ...] = NEW_TOKENS
    prefix: tuple[int, ...] = PREFIX
    moe_variants: tuple[str, ...] = ("default",)
    write_tokens: tuple[int, ...] = WRITE_TOKENS
    notes: dict = field(default_factory=dict)

    @property
    def gemm_list(self) -> list[Gemm]:
        # one table per distinct shape (q_b and o_proj of some models coincide, for instance)
        seen, out = set(), []
        for g in gemms(self.model, self.ckpt, self.layout):
            key = (g.n, g.k, g.dtype)
            if key not in seen:
                seen.add(key)
                out.append(g)
        return out

    @property
    def attention(self) -> AttentionShape:
        return attention_shape(self.model, self.layout, self.kv_cache_dtype)

    @property
    def moe(self) -> MoEShape | None:
        return moe_shape(self.model, self.ckpt, self.layout)

    @property
    def moe_pool(self) -> int | None:
        """The routed experts the server's tokens spread over (None: all, routed apart): a biased
        gate under random weights (``load-format: dummy``) sends every token to a few
        (``tuner.catalog.routing``), and the fused-MoE table is then timed with that routing."""
        return routed_expert_pool(self.model, self.flags)

    @property
    def host_write(self) -> HostWriteShape:
        return host_write_shape(self.model, self.layout, self.kv_cache_dtype, page_size(self.model, self.gpu, self.flags))

    @property
    def contexts(self) -> tuple[int, ...]:
        return tuple(c for c in self.context if c <= self.model.max_context_tokens)

    @property
    def prefixes(self) -> tuple[int, ...]:
        return tuple(p for p in self.prefix if p < self.model.max_context_tokens)

    @property
    def extend_modes(self) -> tuple[str, ...]:
        # Triton MLA: MHA over expanded K/V when no request has a cached prefix, absorbed otherwise
        return ("mha", "absorbed") if self.attention.arch == "mla" else ("mha",)

    def points(self) -> int:
        """Number of timed points (for progress)."""
        n = 0
        if "gemm" in self.ops:
            n += len(self.gemm_list) * len(self.tokens)
        if "decode_attention" in self.ops and self.attention.arch != "dsa":
            n += len(self.batch) * len(self.contexts)
        if "extend_attention" in self.ops and self.attention.arch != "dsa":
            for mode in self.extend_modes:
                n += len(self.new_tokens) * (1 if mode == "mha" and self.attention.arch == "mla" else len(self.prefixes))
        if "moe" in self.ops and self.moe is not None:
            n += len(self.moe_variants) * len(self.tokens)
        if "layer_misc" in self.ops:
            n += len(self.tokens)
        if "sampling" in self.ops:
            n += len(self.batch)
        if "hicache_write" in self.ops:
            n += len(self.write_tokens)
        return n


def build_plan(model: str, hardware: str, flags: dict, *, sglang_version: str | None = None, quick: bool = False,
               ops: tuple[str, ...] | None = None, moe_variants: tuple[str, ...] = ("default",)) -> ProfilePlan:
    """The plan for ``flags`` (tp-size, attn-dp-size, ep-size, quantization, kv-cache-dtype,
    attention-backend) on one GPU of ``hardware``: shapes as each GPU of that parallelism sees them."""

    m, g = get_model(model), get_gpu(hardware)
    layout = parse_layout(m, flags, 1 << 20)  # shapes only: the GPUs of the node are not needed here
    ckpt = resolve_checkpoint(m, flags.get("quantization"))
    bad = [o for o in (ops or ()) if o not in OP_KINDS]
    if bad:
        raise ConfigError(f"unknown operator(s) {bad}; valid: {', '.join(OP_KINDS)}", key="--ops")
    for v in moe_variants:
        if v not in ("default", "tuned"):
            raise ConfigError(f"unknown MoE variant {v!r}; valid: default, tuned", key="--moe-variants")
    grids = {}
    if quick:
        grids = {"tokens": QUICK["tokens"], "batch": QUICK["batch"], "context": QUICK["context"],
                 "new_tokens": QUICK["new_tokens"], "prefix": QUICK["prefix"]}
    return ProfilePlan(model=m, gpu=g, ckpt=ckpt, layout=layout, kv_cache_dtype=kv_cache_dtype(m, g, flags),
                       attention_backend=default_attention_backend(m, g, flags),
                       sglang_version=check_version(sglang_version), flags=dict(flags),
                       ops=tuple(ops) if ops else DEFAULT_OPS, moe_variants=tuple(moe_variants), **grids)
