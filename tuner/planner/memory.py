"""SGLang's memory accounting: default mem_fraction_static, KV cell size, KV pool size, default
max_running_requests, HiCache host capacity, and whether start-up fits after the KV pool.

Versioned: ``sglang_version`` (default 0.5.23) selects the defaults of that release where 0.5.17
and 0.5.23 differ. Formulas and their sources are listed in docs/calibration.md ("Memory planner").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.catalog import GPUDescription, ModelDescription, get_gpu, get_model
from tuner.errors import ConfigError
from tuner.lifecycle import FailureClass

from .activations import prefill_activations
from .parallel import ParallelLayout, flag_bool, flag_float, flag_int, parse_layout
from .startup import default_attention_backend, startup_memory
from .weights import weight_bytes_per_gpu
import re

DEFAULT_SGLANG_VERSION = "0.5.23"

MIB = 2**20
GIB = 2**30
# Free memory lost before the weights load: CUDA context, NCCL and custom all-reduce buffers,
# cuBLAS workspaces (per GPU). Measured values range 0.6-1.5 GiB; see docs/calibration.md. Used
# where the catalog has no measured free memory for the GPU (GPUDescription.sglang_pre_load_free_bytes,
# a model replica on one GPU: one over several GPUs also holds NCCL and all-reduce buffers).
PRE_LOAD_OVERHEAD_BYTES = 1 * GIB
KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
SPEC_ALGOS_WITH_DRAFT_LAYER = ("EAGLE", "NEXTN", "EAGLE3", "MTP")


def pre_load_free_bytes(gpu: GPUDescription, gpus_per_replica: int) -> int:
    """Free device memory per GPU when SGLang starts loading the weights: the catalog's measured
    figure for a model replica on one GPU, else the torch total less PRE_LOAD_OVERHEAD_BYTES."""
    if gpus_per_replica == 1 and gpu.sglang_pre_load_free_bytes:
        return gpu.sglang_pre_load_free_bytes
    return gpu.memory_bytes - PRE_LOAD_OVERHEAD_BYTES


@dataclass(frozen=True)
class MemoryPlan:
    fits: bool
    reason: str
    model: str
    gpu: str
    quantization: str | None
    weight_format: str
    tp_size: int
    attn_dp_size: int
    ep_size: int
    dp_size: int
    gpus_used: int
    weights_gb_per_gpu: float
    weights_gb_by_kind: dict[str, float]
    mem_fraction_static: float
    mem_fraction_static_default: float
    reserved_mib: float
    pre_model_load_gb: float
    kv_cache_gb_per_gpu: float
    kv_cache_dtype: str
    bytes_per_token: int  # KV cell size per GPU (one pool's cell)
    page_size: int
    kv_capacity_tokens_per_gpu: int  # tokens of one KV pool
    kv_pools: int
    kv_capacity_tokens_total: int
    max_running_requests: int  # whole server (per-DP-rank value x ranks)
    max_running_requests_per_dp_rank: int
    max_req_input_len: int
    chunked_prefill_size: int  # per attention-DP rank, after //= attn_dp
    cuda_graph_max_bs_decode: int
    context_length: int
    hierarchical_cache: bool
    hicache_host_tokens_per_pool: int
    hicache_host_gb_total: float
    warnings: tuple[str, ...] = field(default_factory=tuple)
    sglang_version: str = DEFAULT_SGLANG_VERSION
    attention_backend: str = ""
    startup_gb_per_gpu: float = 0.0  # allocated at start-up after the KV pool (graph state, tables)
    prefill_activation_gb_per_gpu: float = 0.0  # one chunked-prefill forward's peak, from the shapes, and the allocator's slack
    startup_free_gb_per_gpu: float = 0.0  # what mem-fraction-static leaves for it
    failure_class: FailureClass | None = None  # why it does not fit (None when it fits)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        return d


def resolve_checkpoint(model: ModelDescription, quantization: str | None):
    """The checkpoint SGLang would load for ``--quantization`` (None means the bf16 weights)."""
    for ckpt in model.checkpoints.values():
        if ckpt.sglang_quantization == quantization:
            return ckpt
    valid = sorted(repr(c.sglang_quantization) for c in model.checkpoints.values())
    raise ConfigError(
        f"model {model.name!r} has no checkpoint for quantization {quantization!r}; valid: {', '.join(valid)}",
        key="quantization",
    )


def rules_version(sglang_version: str | None) -> tuple[int, int, int]:
    """The SGLang release whose rules apply, as (major, minor, patch): the rules were read from
    0.5.17 and 0.5.23, so releases before 0.5.20 follow 0.5.17 and later ones 0.5.23."""

    parts = [int(p) for p in re.findall(r"\d+", str(sglang_version or DEFAULT_SGLANG_VERSION))[:3]]
    if len(parts) < 2:
        raise ConfigError(f"not a SGLang version: {sglang_version!r}; supported: 0.5.17, 0.5.23",
                          key="sglang_version")
    parts += [0] * (3 - len(parts))
    return (0, 5, 17) if tuple(parts) < (0, 5, 20) else (0, 5, 23)


def _gpu_bucket(gpu_mem_mib: int, tp: int, version: tuple[int, int, int] = (0, 5, 23)) -> tuple[int, int]:
    """(default chunked_prefill_size, default decode CUDA-graph max_bs) by GPU memory bucket."""
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        if version < (0, 5, 23):  # 0.5.17 ServerArgs._handle_gpu_memory_settings
            return 2048, 24 if tp < 4 else 80
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_batch_limits(gpu_mem_mib: int, tp: int, sglang_version: str | None = None) -> tuple[int, int]:
    """SGLang's default (chunked_prefill_size, decode CUDA-graph max_bs) for this GPU and TP size."""
    return _gpu_bucket(gpu_mem_mib, tp, rules_version(sglang_version))


def decode_capture_sizes(max_bs: int) -> list[int]:
    """Decode CUDA-graph batch sizes without speculative decoding (0.5.17
    ``ServerArgs._generate_decode_cuda_graph_batch_sizes``): a decode batch runs as the next of them."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    sizes = [s for s in sizes if s <= max_bs]
    return sizes if max_bs in sizes else sizes + [max_bs]


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """Breakable prefill CUDA-graph token counts (``generate_prefill_cuda_graph_batch_sizes``)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def captured_token_counts(model: ModelDescription, flags: dict[str, Any], plan: "MemoryPlan") -> list[int]:
    """The batch sizes (tokens) a server's CUDA graphs run while it starts: the decode capture sizes,
    and with prefill graphs their token counts up to the chunk. Their kernels compile before any traffic."""
    out: list[int] = []
    if not (flag_bool(flags, "disable-cuda-graph") or flag_bool(flags, "disable-decode-cuda-graph")
            or flags.get("cuda-graph-backend-decode") == "disabled"):
        out += decode_capture_sizes(plan.cuda_graph_max_bs_decode)
    if prefill_graph_enabled(model, flags, rules_version(plan.sglang_version)):
        out += prefill_capture_sizes(plan.chunked_prefill_size if plan.chunked_prefill_size > 0 else 8192)
    return sorted(set(out))


def prefill_graph_enabled(model: ModelDescription, flags: dict[str, Any], version: tuple[int, int, int]) -> bool:
    if (flag_bool(flags, "disable-cuda-graph") or flag_bool(flags, "disable-prefill-cuda-graph")
            or flags.get("cuda-graph-backend-prefill") == "disabled"):
        return False
    if flags.get("cuda-graph-backend-prefill"):
        return True  # set explicitly: the compatibility rules are skipped
    # 0.5.17 _disable_breakable_cudagraph_if_incompatible: MLA (not DSA) prefill has no eager breaks
    if version < (0, 5, 23) and model.is_mla and model.attention != "dsa":
        return False
    return True


def default_mem_fraction_static(
    model: ModelDescription, gpu: GPUDescription, layout: ParallelLayout, flags: dict[str, Any],
    sglang_version: str | None = None,
) -> tuple[float, float, int, int]:
    """SGLang's ``handle_gpu_memory_settings``: (mem_fraction_static, reserved MiB,
    chunked_prefill_size before the attention-DP division, decode max_bs)."""
    version = rules_version(sglang_version)
    gpu_mem = gpu.memory_mib
    chunk_default, bs_default = _gpu_bucket(gpu_mem, layout.tp, version)
    chunked = flag_int(flags, "chunked-prefill-size", chunk_default)
    user_bs = flags.get("cuda-graph-max-bs-decode")
    max_bs = flag_int(flags, "cuda-graph-max-bs-decode", bs_default)
    mrr = flags.get("max-running-requests")
    if user_bs is None and mrr is not None:
        max_bs = min(max_bs, flag_int(flags, "max-running-requests", max_bs))
    decode_graph = not (
        flag_bool(flags, "disable-cuda-graph") or flag_bool(flags, "disable-decode-cuda-graph")
        or flags.get("cuda-graph-backend-decode") == "disabled"
    )
    deepep = layout.a2a_backend == "deepep"
    act = max(chunked, 2048) if chunked > 0 else max(flag_int(flags, "max-prefill-tokens", 16384), 2048)
    graph = 0.0
    if decode_graph:
        graph += 2 * max_bs
        if layout.attn_dp > 1:
            graph += max_bs * layout.attn_dp * 3
            if max_bs > 300:
                graph += max_bs * layout.attn_dp * 1.5
    graph += prefill_graph_reserve_mib(model, flags, chunked, version)
    reserved = 512 + 1.5 * act + layout.tp * 1 / 8 * 1024 + graph
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10240)
    if deepep and decode_graph:
        reserved += 2048
    return round((gpu_mem - reserved) / gpu_mem, 3), reserved, chunked, max_bs


def prefill_graph_reserve_mib(model: ModelDescription, flags: dict[str, Any], chunked: int,
                              version: tuple[int, int, int]) -> float:
    """``reserve_for_graph_mb``'s prefill part: 1.5 GiB for MLA, else 8 MiB per capture size."""
    if not prefill_graph_enabled(model, flags, version):
        return 0.0
    if model.is_mla:
        mib = 1536.0
    else:
        max_bs = chunked if chunked > 0 else 8192
        cap = flags.get("max-total-tokens")
        if cap is not None:
            max_bs = min(max_bs, _parse_tokens(cap))
        mib = 8.0 * len(prefill_capture_sizes(max_bs))
    if flags.get("moe-a2a-backend") == "deepep" and flags.get("cuda-graph-backend-prefill", "breakable") == "breakable":
        mib += 1024
    return mib


def kv_cache_dtype(model: ModelDescription, gpu: GPUDescription, flags: dict[str, Any]) -> str:
    value = str(flags.get("kv-cache-dtype") or "auto")
    if value not in KV_DTYPES:
        raise ConfigError(f"unknown kv-cache-dtype {value!r}; valid: {', '.join(KV_DTYPES)}", key="kv-cache-dtype")
    if value == "bfloat16":
        value = "bf16"
    if model.attention == "dsa":
        if value == "auto":
            value = "fp8_e4m3" if gpu.sm_version >= 100 else "bf16"
        if value not in ("bf16", "fp8_e4m3"):
            raise ConfigError(f"DSA models accept only bf16 or fp8_e4m3 KV, got {value!r}", key="kv-cache-dtype")
    elif value == "auto":
        value = "bf16"
    return value


def kv_dtype_bytes(dtype: str) -> float:
    """Bytes of one KV element in SGLang's pool (scales included for the block formats)."""
    return {"bf16": 2.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "mxfp8": 1.0 + 1 / 32,
            "nvfp4": 0.5 + 1 / 16, "fp4_mx_block16": 0.5 + 1 / 16}[dtype]


def speculative_draft_layers(model: ModelDescription, flags: dict[str, Any]) -> int:
    algo = flags.get("speculative-algorithm")
    if algo and str(algo).upper() in SPEC_ALGOS_WITH_DRAFT_LAYER:
        return max(1, model.mtp_layers)
    return 0


def kv_cell_bytes(model: ModelDescription, gpu: GPUDescription, layout: ParallelLayout, dtype: str, draft_layers: int) -> int:
    """Bytes of KV per token on one GPU (``_compute_cell_size``)."""
    layers = model.num_layers
    if model.attention == "dsa":
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        if dtype == "bf16":
            per_layer = latent * 2
        elif gpu.sm_version >= 100 and gpu.sm_version < 120:
            per_layer = latent  # trtllm: raw fp8
        else:
            # flashmla_kv / flashinfer_sparse_mla: fp8 nope + 4 fp32 scales + bf16 rope
            per_layer = model.kv_lora_rank + 16 + model.qk_rope_head_dim * 2
        idim = model.index_head_dim
        per_layer += math.ceil(idim + idim / 128 * 4)  # indexer key cache (fp8 + fp32 scale), index_kpool 1
        cell = per_layer * layers
        return int(cell + cell * draft_layers / layers)
    if model.is_mla:
        cell = (model.kv_lora_rank + model.qk_rope_head_dim) * layers * kv_dtype_bytes(dtype)
    else:
        kv_heads = max(1, model.num_kv_heads // layout.attn_tp)
        cell = kv_heads * 2 * model.head_dim * layers * kv_dtype_bytes(dtype)
    return int(math.ceil(cell + cell * draft_layers / layers))


def page_size(model: ModelDescription, gpu: GPUDescription, flags: dict[str, Any]) -> int:
    if model.attention == "dsa":
        return 64
    user = flags.get("page-size")
    if user is not None:
        return flag_int(flags, "page-size", 1)
    if gpu.sm_version == 100:
        # trtllm_mla (DeepSeek-V3 family) and trtllm_mha default to 64-token pages
        if model.architecture == "DeepseekV3ForCausalLM" or not model.is_mla:
            return 64
    return 1


def plan_memory(
    model: ModelDescription | str,
    gpu: GPUDescription | str,
    gpus: int,
    flags: dict[str, Any],
    *,
    nodes: int = 1,
    host_memory_gb: float | None = None,
    sglang_version: str | None = None,
) -> MemoryPlan:
    """Predict SGLang's memory layout for ``flags`` on ``gpus`` GPUs per node x ``nodes``, with
    the defaults of ``sglang_version`` (default 0.5.23).

    Invalid combinations raise ConfigError; a configuration that does not fit (weights, KV pool,
    start-up allocations after the KV pool, HiCache host memory) returns ``fits=False`` with the
    reason.
    """
    version = ".".join(map(str, rules_version(sglang_version)))
    model = get_model(model)
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if gpus < 1 or nodes < 1:
        raise ConfigError(f"need at least one GPU and one node, got gpus={gpus} nodes={nodes}", key="gpus")
    layout = parse_layout(model, flags, gpus * nodes)
    quant = flags.get("quantization")
    ckpt = resolve_checkpoint(model, quant)
    warnings: list[str] = []

    default_mfs, reserved, chunked_total, max_bs = default_mem_fraction_static(model, gpu, layout, flags, version)
    mfs = flag_float(flags, "mem-fraction-static")
    if mfs is None:
        mfs = default_mfs
    elif not 0 < mfs < 1:
        raise ConfigError(f"must be in (0, 1), got {mfs}", key="mem-fraction-static")
    elif mfs > default_mfs:
        headroom = (1 - mfs) * gpu.memory_mib
        warnings.append(
            f"mem-fraction-static {mfs} leaves {headroom:.0f} MiB for activations and CUDA graphs; "
            f"SGLang's default {default_mfs} reserves {reserved:.0f} MiB (OOM risk under load)"
        )

    draft_layers = speculative_draft_layers(model, flags)
    w_bytes = weight_bytes_per_gpu(
        model, ckpt, layout, with_mtp=draft_layers > 0, dp_lm_head=flag_bool(flags, "enable-dp-lm-head")
    )
    weights = sum(w_bytes.values())
    pre_load = pre_load_free_bytes(gpu, layout.tp)
    dtype = kv_cache_dtype(model, gpu, flags)
    cell = kv_cell_bytes(model, gpu, layout, dtype, draft_layers)
    psize = page_size(model, gpu, flags)

    fits, reason = True, "ok"
    failure = None
    rest = pre_load * mfs - weights  # = free_after_load - pre_load*(1-mfs)
    tokens = 0
    if weights > pre_load:
        fits, reason = False, (
            f"weights need {weights / 1e9:.1f} GB per GPU but only {pre_load / 1e9:.1f} GB are free: "
            "CUDA out of memory while loading the model"
        )
        failure = FailureClass.OOM
    elif rest <= 0:
        fits, reason = False, (
            f"Not enough memory for the KV cache: weights {weights / 1e9:.1f} GB per GPU exceed "
            f"mem-fraction-static {mfs} x {pre_load / 1e9:.1f} GB"
        )
        failure = FailureClass.OOM
    else:
        tokens = int(rest // cell) // psize * psize
        cap = flags.get("max-total-tokens")
        if cap is not None:
            cap = _parse_tokens(cap)
            if cap > tokens:
                warnings.append(f"max-total-tokens {cap} is above the profiled {tokens}; the profiled value is used")
            tokens = min(tokens, cap) // psize * psize
        if tokens <= 0:
            fits, reason = False, "Not enough memory for the KV cache (less than one page)"
            failure = FailureClass.OOM

    context_len = model.max_context_tokens
    user_mrr = flags.get("max-running-requests")
    if user_mrr is not None:
        per_rank = min(flag_int(flags, "max-running-requests", 1) // layout.attn_dp, tokens // 2)
    else:
        per_rank = min(min(max(int(tokens / context_len * 512), 2048), 4096), tokens // 2)
    per_rank = max(per_rank, 0)
    if fits and per_rank < 1:
        fits, reason = False, "KV pool too small to run a single request"
        failure = FailureClass.INFEASIBLE
    chunked = chunked_total // layout.attn_dp if chunked_total > 0 else chunked_total

    # start-up allocations after the KV pool must fit in the slack mem-fraction-static left
    backend = default_attention_backend(model, gpu, flags)
    decode_graph = not (flag_bool(flags, "disable-cuda-graph") or flag_bool(flags, "disable-decode-cuda-graph")
                        or flags.get("cuda-graph-backend-decode") == "disabled")
    start = startup_memory(
        model, gpu, layout, attention_backend=backend, context_len=context_len, max_running_per_rank=per_rank,
        decode_graph=decode_graph, graph_max_bs=max_bs,
        prefill_graph_mib=prefill_graph_reserve_mib(model, flags, chunked_total, rules_version(version)),
        page_size=psize, triton_kv_splits=flags.get("triton-attention-num-kv-splits") and
        flag_int(flags, "triton-attention-num-kv-splits", 8), kv_tokens=max(0, tokens))
    slack = pre_load * (1 - mfs) + max(0.0, rest - tokens * cell)
    if fits and start.total_bytes > slack:
        need = start.total_bytes
        suggest = math.floor((1 - (need + 512 * MIB) / pre_load) * 100) / 100
        parts = f"request table {start.req_to_token_bytes / GIB:.1f} GiB"
        if start.attention_graph_state_bytes:
            parts += (f", {backend} attention CUDA-graph state {start.attention_graph_state_bytes / GIB:.1f} GiB "
                      f"(max bs {start.graph_max_bs}" + (f", {start.max_kv_splits} KV splits" if start.max_kv_splits
                                                          else "") + ")")
        parts += f", CUDA graphs {(start.decode_graph_bytes + start.prefill_graph_bytes) / GIB:.1f} GiB"
        fits, reason = False, (
            f"CUDA out of memory at start-up: after the KV pool, start-up needs {need / GIB:.1f} GiB per GPU "
            f"({parts}) but mem-fraction-static {mfs} leaves {slack / GIB:.1f} GiB; "
            f"use mem-fraction-static <= {suggest:.2f} or a smaller cuda-graph-max-bs-decode"
        )
        failure = FailureClass.OOM
    # what start-up leaves must hold the largest forward step: one chunked-prefill batch
    prefill_tokens = chunked if chunked > 0 else flag_int(flags, "max-prefill-tokens", 16384) // layout.attn_dp
    acts = prefill_activations(model, layout, prefill_tokens, ckpt.weight_format,
                               absorbed_extend=backend == "triton")
    left = slack - start.total_bytes
    if fits and acts.need_bytes > left:
        fits, reason = False, (
            f"CUDA out of memory at the first long prefill: start-up leaves {max(left, 0) / GIB:.2f} GiB per GPU "
            f"(after the KV pool, {start.total_bytes / GIB:.1f} GiB of request table, attention CUDA-graph state "
            f"for max bs {start.graph_max_bs} and graphs) but a {prefill_tokens}-token prefill chunk needs "
            f"{acts.need_bytes / GIB:.2f} GiB of activations ({acts.largest}, with the allocator's slack); use a smaller max-running-requests "
            f"or cuda-graph-max-bs-decode, a smaller chunked-prefill-size, or a lower mem-fraction-static"
        )
        failure = FailureClass.OOM

    hicache = flag_bool(flags, "enable-hierarchical-cache") or flag_bool(flags, "enable-hicache")
    host_tokens, host_gb_total = 0, 0.0
    if hicache:
        size_gb = flag_float(flags, "hicache-size") or 0.0
        if size_gb > 0:
            host_tokens = int(size_gb * 1e9 // cell)
        else:
            ratio = flag_float(flags, "hicache-ratio") or 2.0
            if ratio <= 1.0:
                raise ConfigError(f"hicache-ratio must be > 1 (host pool larger than the device pool), got {ratio}",
                                  key="hicache-ratio")
            host_tokens = int(tokens * ratio)
        host_tokens = host_tokens // psize * psize
        # every GPU process keeps its own host pool (the MLA latent is replicated like on the GPU)
        host_gb_total = host_tokens * cell * layout.world / 1e9
        if host_memory_gb is not None:
            fraction = flag_float(flags, "hicache-host-memory-fraction") or 0.8
            allowed = host_memory_gb * nodes * fraction
            if fits and host_gb_total > allowed:
                fits, reason = False, (
                    f"HiCache needs {host_gb_total:.0f} GB of host memory but {fraction:.0%} of "
                    f"{host_memory_gb * nodes:.0f} GB is {allowed:.0f} GB: not enough host memory"
                )
                failure = FailureClass.OOM

    return MemoryPlan(
        fits=fits,
        reason=reason,
        failure_class=failure,
        model=model.name,
        gpu=gpu.name,
        quantization=quant,
        weight_format=ckpt.weight_format,
        tp_size=layout.tp,
        attn_dp_size=layout.attn_dp,
        ep_size=layout.ep,
        dp_size=layout.dp,
        gpus_used=layout.world,
        weights_gb_per_gpu=round(weights / 1e9, 3),
        weights_gb_by_kind={k: round(v / 1e9, 3) for k, v in w_bytes.items()},
        mem_fraction_static=mfs,
        mem_fraction_static_default=default_mfs,
        reserved_mib=reserved,
        pre_model_load_gb=round(pre_load / 1e9, 3),
        kv_cache_gb_per_gpu=round(tokens * cell / 1e9, 3),
        kv_cache_dtype=dtype,
        bytes_per_token=cell,
        page_size=psize,
        kv_capacity_tokens_per_gpu=tokens,
        kv_pools=layout.kv_pools,
        kv_capacity_tokens_total=tokens * layout.kv_pools,
        max_running_requests=per_rank * layout.kv_pools,
        max_running_requests_per_dp_rank=per_rank,
        max_req_input_len=max(0, min(context_len - 1, tokens - 1) - 5),
        chunked_prefill_size=chunked,
        cuda_graph_max_bs_decode=max_bs,
        context_length=context_len,
        hierarchical_cache=hicache,
        hicache_host_tokens_per_pool=host_tokens,
        hicache_host_gb_total=round(host_gb_total, 3),
        warnings=tuple(warnings),
        sglang_version=version,
        attention_backend=backend,
        startup_gb_per_gpu=round(start.total_bytes / 1e9, 3),
        startup_free_gb_per_gpu=round(slack / 1e9, 3),
        prefill_activation_gb_per_gpu=round(acts.need_bytes / 1e9, 3),
    )


def _parse_tokens(value) -> int:
    """``--max-total-tokens`` accepts 128k / 1M (x1000) and 1Ki / 1Mi (x1024)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    text = str(value).strip()
    units = {"ki": 1024, "mi": 1024**2, "gi": 1024**3, "k": 1000, "m": 1000**2, "g": 1000**3}
    for suffix, mult in units.items():
        if text.lower().endswith(suffix):
            try:
                return int(float(text[: -len(suffix)]) * mult)
            except ValueError:
                break
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"expected a token count like 131072, 128k or 1Mi, got {value!r}",
                          key="max-total-tokens") from None
