"""Step-time model: how long one scheduler step of an SGLang server takes.

A step runs every attention-DP rank of a model replica together (the MoE layer and its
communication synchronise them). Its GPU time is

    max over ranks (linears + attention + per-layer small kernels + HiCache load-back
                    + attention-TP all-reduce)
    + routed-expert GEMMs over the tokens of all ranks + MoE communication
    + sampling + fixed per-step GPU overhead,

and the scheduler's CPU time per step is hidden behind it by the overlap scheduler (``max``) or
added to it without (``--disable-overlap-schedule``).

Every compute operator (each linear layer as a GEMM, decode attention, extend attention, fused
MoE, the per-layer small kernels, sampling) is taken from a measured table of ``tuner profile``
(``tuner.sim.optable``) where one covers its shape and size, and otherwise from a roofline
``max(FLOPs / (peak x eff), bytes / (HBM x eff))`` with peaks from the GPU catalog and efficiencies
from the calibration file. Inter-GPU collectives (attention-TP all-reduce, the attention-DP MoE
gather and reduce-scatter, the DeepEP all-to-all) come from a table of ``tuner profile comm``
measured on a machine with that many GPUs where one covers the group, and otherwise from published
link bandwidths (docs/calibration.md). ``source_summary()`` says which was used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.catalog import Checkpoint, GPUDescription, ModelDescription
from tuner.errors import ConfigError
from tuner.kernels.shapes import TRITON_MOE_DTYPES, moe_shape as kernel_moe_shape
from tuner.planner.parallel import ParallelLayout, flag_bool, flag_int
from tuner.planner.memory import page_size as planner_page_size, prefill_graph_enabled
from tuner.planner.startup import TRITON_DEFAULT_KV_SPLITS, default_attention_backend, triton_max_kv_splits
from tuner.planner.weights import BYTES_PER_PARAM

from .calibrate import SpeedupCurve, collapsed_table, tuned_speedup, tuned_table
from .moe_tiles import best_tile, default_tile, tile_efficiency
from .opshapes import (HICACHE_BATCHED_COPY_BYTES, HICACHE_COPY_QUEUE_CALLS, HICACHE_STAGING_PAGES,
                       attention_shape, gemms, host_write_shape, moe_shape)
from .optable import OpTables, tables_for_gpu
from tuner.catalog.routing import routed_expert_pool
from .scheduler import version_tuple

CATEGORIES = ("linear", "decode_attention", "extend_attention", "moe", "layer_misc", "sampling", "step_overhead",
              "hicache_write")
COMMUNICATION = "communication"  # counted beside the operators: measured on another machine than theirs
TRITON_DECODE_BLOCK_H = 16  # query heads one block of SGLang's grouped Triton decode kernel takes
# SGLang's w8a8 block-fp8 Triton GEMM: K is walked in blocks of the weight's 128-wide scale groups;
# its H200 config files choose 64-wide output tiles at decode sizes (``BLOCK_SIZE_N`` 64 at M 8-64)
FP8_BLOCK_K = 128
FP8_BLOCK_TILE_N = 64


def fp8_block_chain_s(n: int, k: int, sm_count: int, kstep_s: float) -> float:
    """The shortest time of a block-fp8 Triton GEMM with an ``n`` x ``k`` weight at decode sizes:
    each output tile walks K one 128-deep block after another (``kstep_s`` a block), one tile an
    SM, and tiles beyond the SMs queue behind them. The time is flat in tokens until compute
    overtakes it (docs/calibration.md, "Block-fp8 GEMMs at decode sizes")."""
    if kstep_s <= 0:
        return 0.0
    tiles = n / FP8_BLOCK_TILE_N
    return math.ceil(k / FP8_BLOCK_K) * kstep_s * max(1.0, tiles / sm_count)


def triton_decode_splits(batch: int, max_ctx: int, min_ctx: int, head_groups: int, max_splits: int,
                         sm_count: int) -> int:
    """KV splits the longest request of a decode batch gets in SGLang's Triton decode kernel
    (``get_num_kv_splits_triton``, 0.5.17 ``kernels/ops/attention/metadata.py``): enough splits
    to fill the SMs, more as the context grows (log2 of it over 64), at most ``max_splits``; a
    batch whose lengths differ by more than 25% also splits the longest by its ratio to the
    shortest."""
    if batch <= 0 or max_ctx <= 0:
        return 1
    lo = max(1, min_ctx or max_ctx)
    if max_ctx * 8 < lo * 10:
        lo = max_ctx
    by_spread = min(-(-max_ctx // lo), max_splits)
    ext_cores = int(sm_count * max(math.log2(max_ctx / 64.0), 1.0)) if max_ctx > 0 else sm_count
    by_cores = max(1, min(-(-ext_cores // (batch * head_groups)), max_splits))
    chunk_1, chunk_2 = -(-max_ctx // by_spread), -(-max_ctx // by_cores)
    return max(-(-max_ctx // chunk_1), -(-max_ctx // chunk_2))


@dataclass(slots=True)
class RankWork:
    """What one attention-DP rank computes in a step."""

    decode_reqs: int = 0
    decode_ctx_tokens: int = 0  # sum of the decode requests' context lengths
    # the longest and shortest of them (0: unknown, taken as the mean): a split-KV decode kernel
    # waits for the longest request's chain of splits
    decode_max_ctx_tokens: int = 0
    decode_min_ctx_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seqs: int = 0  # sequences whose chunk is in this step (one logit each if finishing)
    prefill_ctx_units: float = 0.0  # sum over chunk tokens of the context they attend (dense)
    load_tokens: int = 0  # HiCache tokens loaded back from host during this step
    extend_items: tuple = ()  # (new tokens, cached prefix) per prefill request

    @property
    def tokens(self) -> int:
        return self.decode_reqs + self.prefill_tokens


def _bucket(tokens: int) -> int:
    """A context's 256-token bucket (-1: not given, 0 meaning "the mean")."""
    return tokens >> 8 if tokens else -1


def _bucket_middle(bucket: int) -> int:
    return (bucket << 8) + 128 if bucket >= 0 else 0


class StepTimeModel:
    def __init__(self, model: ModelDescription, gpu: GPUDescription, ckpt: Checkpoint, layout: ParallelLayout,
                 cell_bytes: int, calibration: dict, *, gpus_per_node: int, moe_tiles: str = "default",
                 cuda_graph_max_bs: int = 512, decode_graph: bool = True, with_mtp: bool = False,
                 kv_cache_dtype: str = "bf16", sglang_version: str = "0.5.23", flags: dict | None = None,
                 op_tables: OpTables | None = None):
        self.m, self.gpu, self.layout, self.cal = model, gpu, layout, calibration
        self.cell = cell_bytes
        self.moe_tiles = moe_tiles
        self.graph_bs = cuda_graph_max_bs if decode_graph else 0
        self.version = sglang_version
        flags = flags or {}
        self.attention_backend = default_attention_backend(model, gpu, flags)
        self.moe_backend = str(flags.get("moe-runner-backend") or "triton")
        if self.moe_backend == "auto":
            self.moe_backend = "triton"
        eff = calibration["compute_efficiency"]
        self.bw = gpu.memory_bandwidth_gbps * 1e9 * calibration["memory_efficiency"]
        # the decode attention kernel's own share of HBM bandwidth (fitted per attention backend)
        self.kv_bw = gpu.memory_bandwidth_gbps * 1e9 * calibration.get("kv_memory_efficiency",
                                                                       calibration["memory_efficiency"])
        self.layers = model.num_layers
        self.h = model.hidden_size
        tables = op_tables if op_tables is not None else tables_for_gpu(gpu.name)
        self._src = {c: [0, 0] for c in (*CATEGORIES, COMMUNICATION)}
        self._files: set[str] = set()

        def find(op, shape, **kw):
            t = tables.find(op, shape, sglang_version=sglang_version, **kw)
            return t

        # ---- linears: every layer's GEMMs -------------------------------------------------
        # (layers, flops per token, weight-read seconds, rate, table, per-logit, name, fixed seconds per call)
        ov = calibration["overhead"]
        # fp8 block-quantized linears: each call first quantizes its input per 128-wide group in a
        # kernel of its own, then runs the block-scaled GEMM (fixed GPU time per call, fitted)
        self.fp8_call_s = float(ov.get("fp8_block_gemm_s", 0.0))
        fp8_kstep_s = float(ov.get("fp8_block_gemm_kstep_s", 0.0))
        self.gemms = []
        self.tile_tuned_gemms: set[str] = set()  # block-fp8 linears: the tuned tile files cover them
        for g in gemms(model, ckpt, layout):
            bpp = BYTES_PER_PARAM[g.dtype]
            rate = self._rate(g.dtype) * (eff.get("dense_fp8_block", eff["dense"]) if g.dtype == "fp8_block"
                                          else eff["dense"])
            table = find("gemm", g.key)
            read_s = g.n * g.k * bpp / self.bw
            fixed_s = 0.0
            if g.dtype == "fp8_block":
                fixed_s = self.fp8_call_s
                # at decode sizes the weight streams no faster than its tiles' chain of K blocks
                read_s = max(read_s, fp8_block_chain_s(g.n, g.k, gpu.sm_count, fp8_kstep_s))
                self.tile_tuned_gemms.add(g.name)
            self.gemms.append((g.layers, 2.0 * g.n * g.k, read_s, rate, table, g.per == "logit", g.name, fixed_s))
        self.any_gemm_table = any(t[4] is not None for t in self.gemms)
        token_gemms = [x for x in self.gemms if not x[5]]
        self.read_bound_tokens = min((r * rate / f for _, f, r, rate, *_ in self.gemms if f), default=0.0)
        self.linear_read_s = sum(layers * (r + fixed) for layers, _, r, _, _, _, _, fixed in token_gemms)
        self.lm_read_s = sum(layers * (r + fixed) for layers, _, r, _, _, logit, _, fixed in self.gemms if logit)

        # ---- attention --------------------------------------------------------------------
        attn_tp = layout.attn_tp
        bf16 = gpu.bf16_tflops * 1e12
        fp8 = gpu.fp8_tflops * 1e12
        self.attn_rate = bf16 * eff["attention"]
        # SGLang's Triton MLA decode kernel (absorbed, 16 heads a tl.dot) is compute-bound at its own,
        # measured rate; other decode kernels (GQA's stream their KV; FA3, FlashInfer, FlashMLA and
        # DSA's sparse ones) take the attention kernels' share
        triton_mla = self.attention_backend == "triton" and model.is_mla and model.attention != "dsa"
        self.decode_attn_rate = bf16 * (eff.get("decode_attention", eff["attention"]) if triton_mla
                                        else eff["attention"])
        ext_eff = eff.get("extend_attention") or {}
        self.attn_shape = attention_shape(model, layout, kv_cache_dtype)
        ab = self.attention_backend
        self.decode_table = find("decode_attention", self.attn_shape.key, attention_backend=ab)
        self.extend_tables = {mode: find("extend_attention", self.attn_shape.key, attention_backend=ab, mode=mode)
                              for mode in ("mha", "absorbed")}
        if model.is_mla:
            heads = model.num_attention_heads / attn_tp
            # absorbed form: q.latent (kv_lora + rope) and p.latent (kv_lora) per head
            absorbed = 2 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) * self.layers
            self.decode_attn_flops = absorbed
            mha = 2 * heads * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) * self.layers
            # dense MLA prefill runs MHA over expanded K/V; DSA's sparse kernels stay absorbed; the
            # Triton backend runs a batch with any cached prefix in the absorbed form
            # (17: models/deepseek_common/attention_backend_handler.py::handle_attention_triton)
            self.prefill_attn_flops = absorbed if model.attention == "dsa" else mha
            self.absorbed_attn_flops = absorbed
            self.absorbed_extend = model.attention != "dsa" and self.attention_backend == "triton"
            # the absorbed extend is SGLang's Triton kernel's own; other backends run a prefix as MHA.
            # Triton runs a batch without a prefix as MHA too, at that kernel's own share
            mha_key = "mla_mha_triton" if self.attention_backend == "triton" else "mla_mha"
            mode_keys = (("dsa", "dsa") if model.attention == "dsa" else
                         (mha_key, "mla_absorbed" if self.absorbed_extend else "mla_mha"))
        else:
            heads = model.num_attention_heads / attn_tp
            self.prefill_attn_flops = 2 * heads * 2 * model.head_dim * self.layers
            self.decode_attn_flops = self.prefill_attn_flops
            self.absorbed_attn_flops = self.prefill_attn_flops
            self.absorbed_extend = False
            mode_keys = ("gqa", "gqa")
        # SGLang's Triton extend kernel's causal part over c new tokens runs at its share x c / (c + n0)
        # (the GQA tables: 0.11 at 1,024 new tokens to 0.20 at 8,192); n0 per architecture, 0 unmeasured
        tiles = calibration.get("extend_causal_tile_tokens") or {}
        self.extend_causal_tiles = tuple(float(tiles.get(k, 0.0)) if self.attention_backend == "triton" else 0.0
                                         for k in mode_keys)  # (no cached prefix, cached prefix)
        # extend-attention rate per mode (no cached prefix, cached prefix)
        def share(key: str) -> float:  # a Triton-only key falls back to its mode's general one
            general = key.removesuffix("_triton")
            return float(ext_eff.get(key, ext_eff.get(general, eff["attention"])))

        self.extend_rates = tuple(bf16 * share(k) for k in mode_keys)
        # the part of an extend over the new tokens themselves (causal) may run at another rate than
        # the part over the cached prefix (the Triton kernel's two stages)
        self.extend_causal_rates = tuple(bf16 * float(ext_eff[k + "_causal"]) if k + "_causal" in ext_eff
                                         else bf16 * share(k) for k in mode_keys)
        self.is_mla = model.is_mla and model.attention != "dsa"
        self.dsa = model.attention == "dsa"
        if self.dsa:
            idx_bytes = model.index_head_dim + model.index_head_dim // 128 * 4
            self.index_bytes_per_token = idx_bytes * self.layers
            self.latent_bytes_per_token = cell_bytes - self.index_bytes_per_token
            # indexer q.k scoring over all context, replicated on every attention-TP rank (fp8)
            self.index_flops = 2 * model.index_n_heads * model.index_head_dim * self.layers
            self.index_rate = fp8 * eff["indexer"]
            self.topk = model.index_topk
        else:
            self.index_bytes_per_token = 0
            self.latent_bytes_per_token = cell_bytes
            self.index_flops = 0.0
            self.index_rate = 1.0
            self.topk = None
        # SGLang's Triton decode kernel splits each request's KV over a few blocks per head group;
        # at small batches the step waits for the longest request's chain of splits (latency-bound),
        # beyond them it streams at the throughput rate (docs/calibration.md, "Decode attention")
        blocks_per_sm = float(calibration.get("decode_attention_blocks_per_sm") or 0.0)
        self.split_kv = self.attention_backend == "triton" and not self.dsa and blocks_per_sm > 0
        self.decode_lanes = gpu.sm_count * blocks_per_sm
        shape = self.attn_shape
        kv_group = max(1, shape.q_heads // max(1, shape.kv_heads))
        self.decode_head_groups = (-(-shape.q_heads // min(TRITON_DECODE_BLOCK_H, kv_group))
                                   if kv_group > 1 else shape.q_heads)
        max_splits = flag_int(flags, "triton-attention-num-kv-splits", TRITON_DEFAULT_KV_SPLITS)
        if max_splits < 1:
            raise ConfigError(f"expected a positive number of KV splits, got {max_splits}",
                              key="triton-attention-num-kv-splits")
        context = flag_int(flags, "context-length", 0) or model.max_context_tokens
        self.decode_max_splits = triton_max_kv_splits(model, gpu, context, max_splits)  # MLA's cap raised
        # the Triton GQA decode kernel takes KV elements no faster than a per-SM rate of its KV dtype
        # (measured: its fp8 KV streams 0.6-0.8 of bf16's time, not half); 0 where none is measured
        elem_rates = calibration.get("decode_kv_elements_per_sm_s") or {}
        triton_gqa = self.attention_backend == "triton" and shape.arch == "gqa"
        elem_rate = float(elem_rates.get(shape.kv_dtype, 0.0)) if triton_gqa else 0.0
        self.decode_kv_element_s_per_token = (shape.layers * shape.kv_heads * (shape.qk_head_dim + shape.v_head_dim)
                                              / (gpu.sm_count * elem_rate)) if elem_rate > 0 else 0.0
        self.host_bw = gpu.host_link_gbps * 1e9 * calibration["host_link_efficiency"]
        # HiCache write-through: the scheduler thread issues the copies of every block it backs
        # up to the host (``HiCacheController.start_writing``), before it streams the batch's tokens
        policy = str(flags.get("hicache-write-policy") or "write_through")
        self.host_write_on_insert = policy != "write_back"
        self.host_write = host_write_shape(model, layout, kv_cache_dtype, planner_page_size(model, gpu, flags))
        self.host_write_per_page = (str(flags.get("hicache-io-backend") or "kernel") == "kernel"
                                    and str(flags.get("hicache-mem-layout") or "page_first") == "page_first")
        self.host_write_call_s = float(calibration["overhead"].get("hicache_write_call_s", 0.0))
        # the copy engine's time per page copy: a fixed cost, then the bytes over the host link
        self.host_copy_s = (float(calibration["overhead"].get("hicache_copy_latency_s", 0.0))
                            + self.host_write.page_tensor_bytes / (gpu.host_link_gbps * 1e9))
        # the scheduler's own time for a backup, timed by ``tuner profile run --ops hicache_write``
        self.host_write_table = find("hicache_write", self.host_write.key) if self.host_write_per_page else None
        self.host_done_table = self.host_write_table.done_table() if self.host_write_table is not None else None

        # ---- routed experts ---------------------------------------------------------------
        self.moe = model.is_moe
        self.moe_table = None
        self.moe_kernel_tag = None
        if self.moe:
            e, k, h = model.n_routed_experts, model.experts_per_token, model.hidden_size
            inter = model.moe_intermediate_size / layout.moe_tp
            self.moe_e, self.moe_k = e, k
            self.moe_pool = routed_expert_pool(model, flags)
            self.moe_n = (int(2 * inter), h)  # gate_up N, down N
            self.moe_shapes = (2 * inter * h, h * inter)  # N x K of the two GEMMs
            self.moe_layers = model.num_moe_layers
            routed_fmt = "bf16" if "routed_experts" in ckpt.unquantized else ckpt.weight_format
            self.moe_bpp = BYTES_PER_PARAM[routed_fmt]
            native = routed_fmt != "nvfp4" or (gpu.fp4_tflops and gpu.sm_version >= 100)
            # without FP4 tensor cores the GEMM runs in bf16 after a per-element dequantize
            mma = self._rate(routed_fmt) if native else gpu.bf16_tflops * 1e12
            self.moe_rate = mma * eff["moe"]
            # each output tile's fixed cost (its pipeline's fill and drain, scales, the write) in K
            # elements' worth: a shallow K (Qwen3's 768-2048) runs further below the kernel's rate
            # than a deep one (DeepSeek-V3's 2048-7168)
            self.moe_k_overhead = float(calibration.get("moe_tile_k_overhead", 0.0))
            self.moe_dequant_rate = None if native else calibration["dequant_gelem_per_s"] * 1e9
            self.moe_fp8_block = routed_fmt == "fp8_block"
            # both expert GEMMs quantize their input first (gate_up's tokens, down's activations)
            self.moe_fixed_s = 2 * self.moe_layers * self.fp8_call_s if self.moe_fp8_block else 0.0
            shape = moe_shape(model, ckpt, layout)
            self.moe_kernel_tag = _kernel_tag(model, layout, routed_fmt)
            # tuned_speedup(cal, tokens, shape_tag=moe_kernel_tag), its table prepared once
            table = tuned_table(calibration, shape_tag=self.moe_kernel_tag)
            if self.moe_pool is not None:
                # tiles timed with tokens routed apart do not hold where every token goes to the same few
                # experts (DeepSeek-V3's: 1.7-2.4x slower than SGLang's default there, measured): only a
                # table timed under that routing counts, and without one tuned tiles are claimed no gain
                table = collapsed_table(calibration, self.moe_kernel_tag) or {1: 1.0}
            self.moe_tuned_speedup = SpeedupCurve(table)
            # a table timed with the routing this server sees: uniform, or the collapsed pool
            self.moe_table = find("moe", {**shape.key, "routed_pool": self.moe_pool},
                                  moe_runner_backend=self.moe_backend,
                                  variant="tuned" if moe_tiles == "tuned" else "default")
        self.sm_count = gpu.sm_count
        self.sm_share = calibration.get("moe_sm_bandwidth_share", 2.0)

        # ---- small kernels, sampling, overheads -------------------------------------------
        misc_shape = {"hidden": model.hidden_size, "arch": self.attn_shape.arch, "moe": bool(self.moe)}
        self.misc_table = find("layer_misc", misc_shape)
        self.sampling_table = find("sampling", {"vocab": -(-model.vocab_size // layout.tp)})
        self.overhead_table = find("step_overhead", {"model": model.name, "tp": layout.tp})
        # an MLA layer runs more small kernels than a GQA one (its latent norms, split rotary, the
        # absorbed batched matmuls, an input quantization per block-fp8 projection)
        self.layer_s = ov["layer_s"] + (float(ov.get("mla_layer_s", 0.0)) if model.is_mla else 0.0)
        self.layer_passes = ov["layer_bytes_passes"]
        self.sampling_s = ov["sampling_s"]
        # each sequence's fp32 logits over the whole vocabulary (gathered from the TP ranks), read
        # ``sampling_logit_passes`` times by the sampler's kernels at the HBM's full rate
        self.sampling_per_seq_s = (float(ov.get("sampling_logit_passes", 0.0)) * 4 * model.vocab_size
                                   / (gpu.memory_bandwidth_gbps * 1e9))
        self.gpu_step_s = ov["gpu_step_s"]
        self.cpu_step_s = ov["cpu_step_s"]
        # --enable-metrics: the scheduler also records each running request's token times every step
        self.per_req_s = ov["per_request_s"] + (float(ov.get("metrics_per_request_s", 0.0))
                                                if flag_bool(flags, "enable-metrics") else 0.0)
        self.eager_s = ov["eager_per_layer_s"] * self.layers
        self.prefill_ov_s = ov["prefill_per_layer_s"] * self.layers
        self.prefill_graph = prefill_graph_enabled(model, flags, version_tuple(sglang_version))
        self.eager_prefill_s = ov.get("eager_prefill_per_layer_s", ov["prefill_per_layer_s"]) * self.layers
        self.prefill_batch_s = float(ov.get("prefill_batch_s", 0.0))
        self.dp_sync_s = ov["dp_attention_sync_s"] if layout.attn_dp > 1 else 0.0

        comm = calibration["comm"]
        link = comm["internode_gbps"] if layout.tp > gpus_per_node else gpu.interconnect_gbps
        self.link_bw = link * 1e9 * comm["bandwidth_efficiency"]
        self.comm_lat = comm["latency_s"]
        self.gpus_per_node = gpus_per_node
        self._tables = tables
        self._comm_found: dict[tuple[str, int], object] = {}
        self._moe_cache: dict[int, float] = {}
        # step_overhead_time and sampling_time by batch (at most max-running-requests x ranks)
        self._overhead_cache: dict[int, float] = {}
        self._sampling_cache: dict[int, float] = {}
        self._decode_cache: dict[tuple[int, int, int, int], float] = {}
        self._linear_cache: dict[tuple[int, int], float] = {}

    def _rate(self, fmt: str) -> float:
        g = self.gpu
        if fmt == "bf16":
            return g.bf16_tflops * 1e12
        if fmt == "fp8_block":
            # SGLang's block-fp8 Triton kernels rescale every 128-wide K block inside the loop, so
            # they run near the bf16 rate, not the fp8 peak (docs/calibration.md)
            return min(g.fp8_tflops, g.bf16_tflops * self.cal["fp8_block_rate_vs_bf16"]) * 1e12
        if g.fp4_tflops and g.sm_version >= 100:
            return g.fp4_tflops * 1e12
        # no FP4 tensor cores: dequantize to bf16 in the GEMM prologue
        return g.bf16_tflops * 1e12 * self.cal["dequant_compute_factor"]

    def _count(self, cat: str, table) -> None:
        if table is None:
            self._src[cat][1] += 1
        else:
            self._src[cat][0] += 1
            self._files.add(table.source.path)

    # ---- operators --------------------------------------------------------------------------
    def linear_time(self, tokens: int, logits: int) -> float:
        key = (tokens, logits)
        t = self._linear_cache.get(key)
        if t is None:
            t = self._linear_time(tokens, logits)
            if len(self._linear_cache) < 100000:
                self._linear_cache[key] = t
        return t

    def _linear_time(self, tokens: int, logits: int) -> float:
        # tuned tiles of the block-fp8 linears, where serving measured them (calibrate.tuned_speedup)
        gemm_speedup = (tuned_speedup(self.cal, tokens, "gemm_tuned_speedup")
                        if self.moe_tiles == "tuned" and self.tile_tuned_gemms else None)
        if not self.any_gemm_table and tokens <= self.read_bound_tokens and not gemm_speedup:
            self._src["linear"][1] += 1
            return self.linear_read_s + (self.lm_read_s if logits else 0.0)
        t = 0.0
        for layers, flops, read_s, rate, table, per_logit, name, fixed_s in self.gemms:
            n = logits if per_logit else tokens
            if n <= 0:
                continue
            v = table.lookup_s(n) if table is not None else None
            if v is None:
                v = max(flops * n / rate, read_s) + fixed_s
                self._count("linear", None)
            else:
                self._count("linear", table)
            if gemm_speedup and name in self.tile_tuned_gemms and not per_logit:
                v /= gemm_speedup
            t += layers * v
        return t

    def decode_splits(self, batch: int, max_ctx: int, min_ctx: int = 0) -> int:
        """KV splits of the batch's longest request (``triton_decode_splits``)."""
        return triton_decode_splits(batch, max_ctx, min_ctx, self.decode_head_groups, self.decode_max_splits,
                                    self.sm_count)

    def decode_attention_time(self, batch: int, ctx: int, max_ctx: int = 0, min_ctx: int = 0) -> float:
        """Decode attention of ``batch`` requests holding ``ctx`` tokens of context in all, the
        longest ``max_ctx`` and the shortest ``min_ctx`` (0: the mean)."""
        if batch and self.split_kv and not max_ctx:
            max_ctx = -(-ctx // batch)
        if self.decode_table is not None and batch:
            v = self.decode_table.lookup_s(batch, ctx / batch)
            if v is not None:
                self._count("decode_attention", self.decode_table)
                if self.split_kv and max_ctx * batch > ctx:
                    # the longest request alone, over the splits it gets alone and in this batch
                    alone = self.decode_table.lookup_s(1, max_ctx)
                    if alone is not None:
                        alone *= self.decode_splits(1, max_ctx) / self.decode_splits(batch, max_ctx, min_ctx)
                        v = max(v, alone)
                return v * self.layers
        self._src["decode_attention"][1] += 1
        if self.dsa:
            attended = min(ctx, batch * self.topk)
            kv_bytes = attended * self.latent_bytes_per_token + ctx * self.index_bytes_per_token
            return max(attended * self.decode_attn_flops / self.decode_attn_rate,
                       kv_bytes / self.kv_bw) + ctx * self.index_flops / self.index_rate
        per_token = max(self.decode_attn_flops / self.decode_attn_rate, self.cell / self.kv_bw,
                        self.decode_kv_element_s_per_token)
        t = ctx * per_token
        if self.split_kv and batch:
            # the longest request's share of the work runs on its own blocks (head groups x its
            # splits) where the batch as a whole fills ``decode_lanes`` of them
            blocks = self.decode_head_groups * self.decode_splits(batch, max_ctx, min_ctx)
            if blocks < self.decode_lanes:
                latency = max_ctx * per_token * self.decode_lanes / blocks
                if latency > t:
                    t = latency
        return t

    def extend_attention_time(self, w: RankWork) -> float:
        # Triton MLA: a batch without any cached prefix runs MHA over expanded K/V, else absorbed MLA
        prefix = False  # any request with a cached prefix (a loop: cheaper than any() over a generator)
        for _, p in w.extend_items:
            if p:
                prefix = True
                break
        mode = "absorbed" if self.is_mla and prefix else "mha"
        table = self.extend_tables.get(mode)
        if table is not None and w.extend_items:
            total = 0.0
            for c, cached in w.extend_items:
                v = table.lookup_s(c, cached)
                if v is None:
                    break
                total += v
            else:
                self._count("extend_attention", table)
                return total * self.layers
        self._src["extend_attention"][1] += 1
        units = w.prefill_ctx_units
        mode = 1 if prefix else 0
        rate = self.extend_rates[mode]
        if self.dsa:
            attended = min(units, w.prefill_tokens * self.topk)
            return attended * self.prefill_attn_flops / rate + units * self.index_flops / self.index_rate
        flops = self.absorbed_attn_flops if prefix and self.absorbed_extend else self.prefill_attn_flops
        if w.extend_items:
            causal = new = 0.0
            for c, _ in w.extend_items:
                causal += c * c / 2
                new += c
            # the causal part runs at its share only for long chunks: c (c + n0) / 2 pairs' worth
            charged = causal + new * self.extend_causal_tiles[mode] / 2
            return ((units - causal) * flops / rate + charged * flops / self.extend_causal_rates[mode])
        return units * flops / rate

    def layer_misc_time(self, tokens: int) -> float:
        """Norms, rotary embedding, activation and routing kernels of every layer."""
        if self.misc_table is not None:
            v = self.misc_table.lookup_s(tokens)
            if v is not None:
                self._count("layer_misc", self.misc_table)
                return v * self.layers
        self._src["layer_misc"][1] += 1
        return self.layers * (self.layer_s + tokens * self.h * 2 * self.layer_passes / self.bw)

    def sampling_time(self, seqs: int) -> float:
        if not seqs:
            return 0.0
        if self.sampling_table is not None:
            v = self.sampling_table.lookup_s(seqs)
            if v is not None:
                self._count("sampling", self.sampling_table)
                return v
        self._src["sampling"][1] += 1
        return self.sampling_s + seqs * self.sampling_per_seq_s

    def step_overhead_time(self, batch: int) -> float:
        if self.overhead_table is not None:
            v = self.overhead_table.lookup_s(max(1, batch))
            if v is not None:
                self._count("step_overhead", self.overhead_table)
                return v
        self._src["step_overhead"][1] += 1
        return self.gpu_step_s

    # ---- per rank -------------------------------------------------------------------------
    def rank_time(self, w: RankWork) -> float:
        if not w.prefill_tokens and not w.load_tokens:
            if not w.decode_reqs:
                return 0.0
            # decode-only ranks: memoised on (batch, contexts in 256-token buckets), each bucket timed
            # at its middle, so a step's time does not depend on which step filled the memo
            key = (w.decode_reqs, _bucket(w.decode_ctx_tokens), _bucket(w.decode_max_ctx_tokens),
                   _bucket(w.decode_min_ctx_tokens))
            t = self._decode_cache.get(key)
            if t is None:
                t = self._rank_time(RankWork(decode_reqs=w.decode_reqs, decode_ctx_tokens=_bucket_middle(key[1]),
                                             decode_max_ctx_tokens=_bucket_middle(key[2]),
                                             decode_min_ctx_tokens=_bucket_middle(key[3])))
                if len(self._decode_cache) < 200000:
                    self._decode_cache[key] = t
            return t
        return self._rank_time(w)

    def _rank_time(self, w: RankWork) -> float:
        tokens = w.decode_reqs + w.prefill_tokens
        logits = w.decode_reqs + w.prefill_seqs
        t = self.linear_time(tokens, logits) + self.layer_misc_time(tokens)
        if w.decode_reqs:
            t += self.decode_attention_time(w.decode_reqs, w.decode_ctx_tokens, w.decode_max_ctx_tokens,
                                            w.decode_min_ctx_tokens)
        if w.prefill_tokens:
            t += self.extend_attention_time(w)
        if w.load_tokens:
            # HiCache loads layer by layer on its own stream; the forward waits per layer
            load = w.load_tokens * self.cell / self.host_bw
            t = max(t, load) + min(t, load) / self.layers
        n = self.layout.attn_tp
        if n > 1 and tokens:
            t += 2 * self.layers * self.all_reduce_s(n, tokens * self.h * 2)
        return t

    # ---- collectives: a measured table of the group's size, else the link's analytic time ----
    def _collective_s(self, op: str, gpus: int, nbytes: float, analytic_s: float) -> float:
        key = (op, gpus)
        table = self._comm_found.get(key, False)
        if table is False:
            nodes = -(-gpus // self.gpus_per_node)
            table = self._comm_found[key] = self._tables.find(op, {"gpus": gpus, "nodes": nodes},
                                                              sglang_version=self.version)
        v = table.lookup_s(nbytes) if table is not None else None
        if v is None:
            self._src[COMMUNICATION][1] += 1
            return analytic_s
        self._count(COMMUNICATION, table)
        return v

    def all_reduce_s(self, gpus: int, nbytes: float) -> float:
        """One all-reduce of ``nbytes`` over ``gpus`` GPUs (ring: 2(n-1)/n of the buffer crosses the link)."""
        return self._collective_s("all_reduce", gpus, nbytes,
                                  self.comm_lat + 2 * (gpus - 1) / gpus * nbytes / self.link_bw)

    def moe_comm_time(self, tokens: int) -> float:
        """Token dispatch and combine between attention-DP ranks around the MoE layers (0 without
        attention DP): DeepEP's all-to-all (fp8 dispatch, bf16 combine) among the EP group, else a
        gather of every rank's tokens and a reduce-scatter of the results."""
        lay = self.layout
        if not self.moe or tokens <= 0 or not (lay.attn_dp > 1 and lay.tp > 1):
            return 0.0
        if lay.a2a_backend == "deepep":
            ep = lay.ep
            send = tokens / lay.attn_dp * self.moe_k * self.h  # one GPU's dispatch buffer, 1 byte an element
            cross = (ep - 1) / ep  # the share that leaves the GPU
            dispatch = self._collective_s("all_to_all", ep, send, self.comm_lat + send * cross / self.link_bw)
            combine = self._collective_s("all_to_all", ep, 2 * send, self.comm_lat + 2 * send * cross / self.link_bw)
            return self.moe_layers * (dispatch + combine)
        n = lay.tp
        nbytes = tokens * self.h * 2  # every rank's tokens, bf16: the gathered buffer
        one_way = self.comm_lat + (n - 1) / n * nbytes / self.link_bw
        return self.moe_layers * (self._collective_s("all_gather", n, nbytes, one_way)
                                  + self._collective_s("reduce_scatter", n, nbytes, one_way))

    # ---- routed experts over the tokens of all ranks --------------------------------------
    def moe_time(self, tokens: int) -> float:
        if not self.moe or tokens <= 0:
            return 0.0
        cached = self._moe_cache.get(tokens)
        if cached is not None:
            return cached
        e, k, ep = self.moe_e, self.moe_k, self.layout.ep
        # under attention DP every GPU's MoE layer sees the tokens of all ranks
        local = self.moe_table.lookup_s(tokens) if self.moe_table is not None else None
        if local is not None:
            self._count("moe", self.moe_table)
            total = local * self.moe_layers
        else:
            self._src["moe"][1] += 1
            total = self._moe_roofline(tokens, e, k, ep)
        # token dispatch / combine between attention-DP ranks; under moe-TP without attention DP
        # the all-reduce after the MoE is counted with attention-TP's in rank_time
        total += self.moe_comm_time(tokens)
        if len(self._moe_cache) < 100000:
            self._moe_cache[tokens] = total
        return total

    def _moe_roofline(self, tokens: int, e: int, k: int, ep: int) -> float:
        pool = self.moe_pool or e  # the experts tokens spread over (fewer under a collapsed router)
        p_act = 1.0 - (1.0 - k / pool) ** tokens
        active_local = pool / ep * p_act  # expected distinct local experts touched per layer
        rows = tokens * k / pool / p_act  # tokens per touched expert
        slots = tokens * k / ep  # (token, expert) pairs on this GPU
        # the tuned tiles' measured speedup at this batch (None: unmeasured)
        measured = self.moe_tuned_speedup(tokens) if self.moe_tiles == "tuned" else None
        total = 0.0
        for n, nk in zip(self.moe_n, self.moe_shapes):
            flops = 2 * slots * nk * self.moe_layers
            nbytes = active_local * nk * self.moe_bpp * self.moe_layers
            bm, bn = default_tile(tokens, e // ep, self.moe_fp8_block)
            # the per-tile K cost (moe_tile_k_overhead): a moe-TP slice's down GEMM can be 256 deep
            depth_cost = 1.0 + self.moe_k_overhead / (nk / n)
            if self.moe_tiles == "tuned" and measured is None:
                balance = (flops * depth_cost / self.moe_rate) / max(nbytes / self.bw, 1e-12)
                bm, bn = best_tile(max(1, round(rows)), max(1, round(active_local)), n, self.sm_count,
                                   self.sm_share, round(balance, 2))
            c_eff, b_eff = tile_efficiency(rows, active_local, n, bm, bn, self.sm_count, self.sm_share)
            compute = flops / (self.moe_rate * c_eff) * depth_cost
            if self.moe_dequant_rate:
                compute += active_local * nk * self.moe_layers / self.moe_dequant_rate
            total += max(compute, nbytes / (self.bw * b_eff))
        if measured:
            total /= measured
        return total + self.moe_fixed_s

    # ---- one synchronised step of all ranks -------------------------------------------------
    def gpu_time(self, ranks: list[RankWork], overheads: bool = True, thread_busy_s: float = 0.0) -> float:
        """GPU time of one synchronised step of all ranks; ``overheads=False`` leaves out what no
        operator table measures (fixed per-step time, launch costs, DP sync): the per-op sum.
        ``thread_busy_s``: the scheduler thread's other work in the step, which a prefill's
        launches (on the same thread) wait behind."""
        worst = 0.0
        tokens = 0
        prefill = False
        max_bs = 0
        seqs = 0
        decode_cache = self._decode_cache
        for w in ranks:
            d = w.decode_reqs
            if w.prefill_tokens or w.load_tokens:
                p = w.prefill_tokens
                rt = self._rank_time(w)
                tokens += d + p
                if p:
                    prefill = True
                s = d + w.prefill_seqs
                if s > seqs:
                    seqs = s
            elif d:  # decode only: rank_time's memo, read here (the hot path of every step)
                rt = decode_cache.get((d, w.decode_ctx_tokens >> 8, w.decode_max_ctx_tokens >> 8,
                                       w.decode_min_ctx_tokens >> 8))
                if rt is None:
                    rt = self.rank_time(w)
                tokens += d
            else:
                continue  # an idle rank adds nothing
            if rt > worst:
                worst = rt
            if d > max_bs:
                max_bs = d
        if max_bs > seqs:  # a decode-only rank's sequences are its batch
            seqs = max_bs
        moe = self._moe_cache.get(tokens)
        if moe is None:
            moe = self.moe_time(tokens)
        sampling = self._sampling_cache.get(seqs)
        if sampling is None:
            sampling = self._sampling_cache[seqs] = self.sampling_time(seqs)
        gpu = worst + moe + sampling
        if not overheads:
            return gpu
        ov = self._overhead_cache.get(max_bs)
        if ov is None:
            ov = self._overhead_cache[max_bs] = self.step_overhead_time(max_bs)
        if prefill:
            # launching a prefill's layers (from Python one kernel at a time without prefill CUDA
            # graphs; the breakable graphs' eager attention between segments with them) runs ahead
            # of its kernels, so the step is the longer of the two: launch-bound for short prompts,
            # kernel-bound for long ones (results/h100-sglang/prefill-probe); plus building the batch
            # (prefix matches, KV allocation, the request-to-token table)
            launch = self.prefill_ov_s if self.prefill_graph else self.eager_prefill_s
            return max(gpu + ov, launch + thread_busy_s) + self.prefill_batch_s + self.dp_sync_s
        gpu += ov + self.dp_sync_s
        if max_bs > self.graph_bs:
            gpu += self.eager_s  # decode batch larger than the captured CUDA graphs: eager launch
        return gpu

    def host_write_calls(self, tokens: int) -> int:
        """CUDA runtime calls of one backup of ``tokens`` (SGLang 0.5.17): with the kernel io
        backend and the page-first host layout it gathers 64 pages at a time into a staging buffer
        (one launch each) and copies each page of each KV tensor with its own ``cudaMemcpyAsync``
        unless a page spans 128 KiB, when one batched copy takes a launch's pages
        (``transfer_hicache_all_layer_staged_lf_pf``, ``staged_write_back.cuh``); other layouts run
        one transfer kernel."""
        if tokens <= 0:
            return 0
        shape = self.host_write
        if not self.host_write_per_page:
            return 1
        pages = -(-tokens // shape.page_size)
        launches = -(-pages // HICACHE_STAGING_PAGES)
        per_page = shape.page_tensor_bytes < HICACHE_BATCHED_COPY_BYTES
        return launches + (pages * shape.tensors if per_page else launches)

    def host_write_cpu_s(self, tokens: int, gate_s: float = 0.0) -> float:
        """Scheduler CPU time to back ``tokens`` up to the host pool (HiCache write-through),
        issued onto a write stream that may not start for ``gate_s``.

        The issue time is the measured table's where one covers this shape, else the call count
        at ``hicache_write_call_s``. The driver queues ``HICACHE_COPY_QUEUE_CALLS`` of them; past
        that, each further call waits for a copy to finish. The write stream starts behind an
        event on the scheduler's stream, which the overlap scheduler has made wait for the step
        it just launched (``_apply_war_barrier``): the whole forward of an extend or eager step,
        next to nothing behind a decode CUDA graph (its read-done event). So a backup longer than
        the queue holds the thread until that step ends and the rest has been copied."""
        if tokens <= 0 or not self.host_write_on_insert:
            return 0.0
        calls = self.host_write_calls(tokens)
        issue = None
        table = self.host_write_table
        if table is not None:
            issue = table.lookup_s(tokens)
            self._count("hicache_write", table if issue is not None else None)
        else:
            self._count("hicache_write", None)
        if issue is None:
            issue = calls * self.host_write_call_s
        if calls <= HICACHE_COPY_QUEUE_CALLS:
            return issue
        copied = self.host_done_table.lookup_s(tokens) if self.host_done_table is not None else None
        if copied is None:
            copied = calls * self.host_copy_s
        return max(issue, gate_s + copied * (calls - HICACHE_COPY_QUEUE_CALLS) / calls)

    def write_gate_s(self, ranks: list[RankWork], dt: float) -> float:
        """How long the step just launched (lasting ``dt``) keeps a backup's write stream from
        starting: all of it unless it is a decode replayed from a CUDA graph."""
        prefill = any(w.prefill_tokens or w.load_tokens for w in ranks)
        if prefill or max((w.decode_reqs for w in ranks), default=0) > self.graph_bs:
            return dt
        return 0.0

    def step_time(self, ranks: list[RankWork], running: int = 0, overlap: bool = True) -> float:
        """Wall time of one step: the GPU time, and the scheduler's CPU time hidden behind it by
        the overlap scheduler (or added to it without)."""
        cpu = self.cpu_step_s + self.per_req_s * running
        if not overlap:
            return self.gpu_time(ranks) + cpu
        # a prefill's launches and the scheduler's other work share one thread (gpu_time)
        return max(self.gpu_time(ranks, thread_busy_s=cpu), cpu)

    # ---- provenance ---------------------------------------------------------------------------
    def source_summary(self) -> dict:
        """Which operators came from measured tables and which from the roofline."""
        ops = {}
        for cat in CATEGORIES:
            prof, roof = self._src[cat]
            if prof or roof:
                ops[cat] = "profile" if not roof else "roofline" if not prof else "mixed"
        values = set(ops.values())
        overall = "roofline" if values <= {"roofline"} else "profile" if values == {"profile"} else "mixed"
        prof, roof = self._src[COMMUNICATION]
        comm = "none" if not (prof or roof) else "profile" if not roof else "analytic" if not prof else "mixed"
        return {"overall": overall, "ops": ops, "communication": comm,
                "profiles": sorted(self._files), "attention_backend": self.attention_backend}


def _kernel_tag(model: ModelDescription, layout: ParallelLayout, routed_fmt: str) -> str | None:
    """The fused-MoE shape one GPU runs, as the kernel tuner names it (``MoEShape.tag``: SGLang's
    local experts, fused shared experts and moe-TP slice): the key of its own tuned-speedup table.
    None where the weights run no Triton fused MoE."""
    dtype = TRITON_MOE_DTYPES.get(routed_fmt)
    if dtype is None:
        return None
    try:
        return kernel_moe_shape(model, layout.tp, layout.ep, dtype[0], dtype[1]).tag
    except ConfigError:
        return None
