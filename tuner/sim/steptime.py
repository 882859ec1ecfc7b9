"""Step-time model: how long one scheduler step of an SGLang server takes, from first principles.

A step runs every attention-DP rank of a model replica together (the MoE layer and its
communication synchronise them). Its time is

    max over ranks (non-expert linears + attention + HiCache load-back + attention-TP all-reduce)
    + routed-expert GEMMs over the tokens of all ranks + MoE communication + fixed overheads,

where every GEMM / attention term is a roofline ``max(FLOPs / (peak x eff), bytes / (HBM x eff))``
with peaks from the GPU catalog and efficiencies from the calibration file. See
docs/calibration.md for every assumption.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.catalog import Checkpoint, GPUDescription, ModelDescription
from tuner.planner.parallel import ParallelLayout
from tuner.planner.weights import BYTES_PER_PARAM, weight_bytes_per_gpu

from .calibrate import tuned_speedup
from .moe_tiles import best_tile, default_tile, tile_efficiency


@dataclass(slots=True)
class RankWork:
    """What one attention-DP rank computes in a step."""

    decode_reqs: int = 0
    decode_ctx_tokens: int = 0  # sum of the decode requests' context lengths
    prefill_tokens: int = 0
    prefill_seqs: int = 0  # sequences whose chunk is in this step (one logit each if finishing)
    prefill_ctx_units: float = 0.0  # sum over chunk tokens of the context they attend (dense)
    load_tokens: int = 0  # HiCache tokens loaded back from host before this step

    @property
    def tokens(self) -> int:
        return self.decode_reqs + self.prefill_tokens


class StepTimeModel:
    def __init__(self, model: ModelDescription, gpu: GPUDescription, ckpt: Checkpoint, layout: ParallelLayout,
                 cell_bytes: int, calibration: dict, *, gpus_per_node: int, moe_tiles: str = "default",
                 cuda_graph_max_bs: int = 512, decode_graph: bool = True, with_mtp: bool = False):
        self.m, self.gpu, self.layout, self.cal = model, gpu, layout, calibration
        self.cell = cell_bytes
        self.moe_tiles = moe_tiles
        self.graph_bs = cuda_graph_max_bs if decode_graph else 0
        eff = calibration["compute_efficiency"]
        self.bw = gpu.memory_bandwidth_gbps * 1e9 * calibration["memory_efficiency"]
        self.bw_raw = gpu.memory_bandwidth_gbps * 1e9
        self.layers = model.num_layers
        w = weight_bytes_per_gpu(model, ckpt, layout, with_mtp=False)

        def fmt(kind):
            return "bf16" if kind == "norms" or kind in ckpt.unquantized else ckpt.weight_format

        def rate(kind):
            return self._rate(fmt(kind))

        # (flops per token per GPU, weight-read time per step, compute rate x eff) per linear group
        self.linear_groups = []
        for kinds in (("attention",), ("indexer",), ("dense_mlp",), ("shared_expert",), ("router",)):
            params = sum(w[k] / BYTES_PER_PARAM[fmt(k)] for k in kinds)
            byt = sum(w[k] for k in kinds)
            if params:
                self.linear_groups.append((2 * params, byt / self.bw, rate(kinds[0]) * eff["dense"]))
        lm_params = w["lm_head"] / BYTES_PER_PARAM[fmt("lm_head")]
        self.lm_head = (2 * lm_params, w["lm_head"] / self.bw, rate("lm_head") * eff["dense"])
        # below this many tokens every linear group is bound by reading its weights (constant time)
        groups = self.linear_groups + [self.lm_head]
        self.read_bound_tokens = min((r * rate / f for f, r, rate in groups if f), default=0.0)
        self.linear_read_s = sum(r for _, r, _ in self.linear_groups)

        attn_tp = layout.attn_tp
        bf16 = gpu.bf16_tflops * 1e12
        fp8 = gpu.fp8_tflops * 1e12
        self.attn_rate = bf16 * eff["attention"]
        if model.is_mla:
            heads = model.num_attention_heads / attn_tp
            # absorbed form: q.latent (kv_lora + rope) and p.latent (kv_lora) per head
            absorbed = 2 * heads * (2 * model.kv_lora_rank + model.qk_rope_head_dim) * self.layers
            self.decode_attn_flops = absorbed
            # dense MLA prefill runs MHA over expanded K/V; DSA's sparse kernels stay absorbed
            self.prefill_attn_flops = absorbed if model.attention == "dsa" else 2 * heads * (
                model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) * self.layers
        else:
            heads = model.num_attention_heads / attn_tp
            self.prefill_attn_flops = 2 * heads * 2 * model.head_dim * self.layers
            self.decode_attn_flops = self.prefill_attn_flops
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
        self.host_bw = gpu.host_link_gbps * 1e9 * calibration["host_link_efficiency"]

        # routed experts
        self.moe = model.is_moe
        if self.moe:
            e, k, h = model.n_routed_experts, model.experts_per_token, model.hidden_size
            inter = model.moe_intermediate_size / layout.moe_tp
            self.moe_e, self.moe_k = e, k
            self.moe_n = (int(2 * inter), h)  # gate_up N, down N
            self.moe_shapes = (2 * inter * h, h * inter)  # N x K of the two GEMMs
            self.moe_layers = model.num_moe_layers
            self.moe_bpp = BYTES_PER_PARAM[fmt("routed_experts")]
            routed_fmt = fmt("routed_experts")
            native = routed_fmt != "nvfp4" or (gpu.fp4_tflops and gpu.sm_version >= 100)
            # without FP4 tensor cores the GEMM runs in bf16 after a per-element dequantize
            mma = self._rate(routed_fmt) if native else gpu.bf16_tflops * 1e12
            self.moe_rate = mma * eff["moe"]
            self.moe_dequant_rate = None if native else calibration["dequant_gelem_per_s"] * 1e9
            self.moe_fp8_block = fmt("routed_experts") == "fp8_block"
        self.sm_count = gpu.sm_count
        self.sm_share = calibration.get("moe_sm_bandwidth_share", 2.0)

        comm = calibration["comm"]
        link = comm["internode_gbps"] if layout.tp > gpus_per_node else gpu.interconnect_gbps
        self.link_bw = link * 1e9 * comm["bandwidth_efficiency"]
        self.comm_lat = comm["latency_s"]
        self.h = model.hidden_size
        ov = calibration["overhead"]
        self.step_s = ov["step_s"]
        self.eager_s = ov["eager_per_layer_s"] * self.layers
        self.prefill_ov_s = ov["prefill_per_layer_s"] * self.layers
        self.dp_sync_s = ov["dp_attention_sync_s"] if layout.attn_dp > 1 else 0.0
        self.per_req_s = ov["per_request_s"]
        self._moe_cache: dict[int, float] = {}
        self._decode_cache: dict[tuple[int, int], float] = {}

    def _rate(self, fmt: str) -> float:
        g = self.gpu
        if fmt == "bf16":
            return g.bf16_tflops * 1e12
        if fmt == "fp8_block":
            return g.fp8_tflops * 1e12
        if g.fp4_tflops and g.sm_version >= 100:
            return g.fp4_tflops * 1e12
        # no FP4 tensor cores: dequantize to bf16 in the GEMM prologue
        return g.bf16_tflops * 1e12 * self.cal["dequant_compute_factor"]

    # ---- per rank -------------------------------------------------------------------------
    def rank_time(self, w: RankWork) -> float:
        if not w.prefill_tokens and not w.load_tokens:
            if not w.decode_reqs:
                return 0.0
            # decode-only ranks: memoised on (batch, context in 256-token buckets)
            key = (w.decode_reqs, w.decode_ctx_tokens >> 8)
            t = self._decode_cache.get(key)
            if t is None:
                t = self._rank_time(w)
                if len(self._decode_cache) < 200000:
                    self._decode_cache[key] = t
            return t
        return self._rank_time(w)

    def _rank_time(self, w: RankWork) -> float:
        tokens = w.decode_reqs + w.prefill_tokens
        logits = w.decode_reqs + w.prefill_seqs
        if tokens <= self.read_bound_tokens:
            t = self.linear_read_s + (self.lm_head[1] if logits else 0.0)
        else:
            t = 0.0
            for flops, read_s, rate in self.linear_groups:
                t += max(flops * tokens / rate, read_s)
            if logits:
                flops, read_s, rate = self.lm_head
                t += max(flops * logits / rate, read_s)
        if w.decode_reqs:
            ctx = w.decode_ctx_tokens
            if self.dsa:
                attended = min(ctx, w.decode_reqs * self.topk)
                kv_bytes = attended * self.latent_bytes_per_token + ctx * self.index_bytes_per_token
                t += max(attended * self.decode_attn_flops / self.attn_rate,
                         kv_bytes / self.bw) + ctx * self.index_flops / self.index_rate
            else:
                t += max(ctx * self.decode_attn_flops / self.attn_rate, ctx * self.cell / self.bw)
        if w.prefill_tokens:
            units = w.prefill_ctx_units
            if self.dsa:
                attended = min(units, w.prefill_tokens * self.topk)
                t += attended * self.prefill_attn_flops / self.attn_rate
                t += units * self.index_flops / self.index_rate
            else:
                t += units * self.prefill_attn_flops / self.attn_rate
        if w.load_tokens:
            t += w.load_tokens * self.cell / self.host_bw
        n = self.layout.attn_tp
        if n > 1 and tokens:
            nbytes = tokens * self.h * 2
            t += 2 * self.layers * (self.comm_lat + 2 * (n - 1) / n * nbytes / self.link_bw)
        return t

    # ---- routed experts over the tokens of all ranks --------------------------------------
    def moe_time(self, tokens: int) -> float:
        if not self.moe or tokens <= 0:
            return 0.0
        cached = self._moe_cache.get(tokens)
        if cached is not None:
            return cached
        e, k, ep = self.moe_e, self.moe_k, self.layout.ep
        p_act = 1.0 - (1.0 - k / e) ** tokens
        active_local = e / ep * p_act  # expected distinct local experts touched per layer
        rows = tokens * k / e / p_act  # tokens per touched expert
        slots = tokens * k / ep  # (token, expert) pairs on this GPU
        total = 0.0
        for n, nk in zip(self.moe_n, self.moe_shapes):
            flops = 2 * slots * nk * self.moe_layers
            nbytes = active_local * nk * self.moe_bpp * self.moe_layers
            bm, bn = default_tile(tokens, e // ep, self.moe_fp8_block)
            if self.moe_tiles == "tuned" and tuned_speedup(self.cal, tokens) is None:
                balance = (flops / self.moe_rate) / max(nbytes / self.bw, 1e-12)
                bm, bn = best_tile(max(1, round(rows)), max(1, round(active_local)), n, self.sm_count,
                                   self.sm_share, round(balance, 2))
            c_eff, b_eff = tile_efficiency(rows, active_local, n, bm, bn, self.sm_count, self.sm_share)
            compute = flops / (self.moe_rate * c_eff)
            if self.moe_dequant_rate:
                compute += active_local * nk * self.moe_layers / self.moe_dequant_rate
            total += max(compute, nbytes / (self.bw * b_eff))
        if self.moe_tiles == "tuned":
            measured = tuned_speedup(self.cal, tokens)
            if measured:
                total /= measured
        # token dispatch / combine between attention-DP ranks (gather + reduce-scatter, or a2a)
        lay = self.layout
        if lay.attn_dp > 1 and lay.tp > 1:
            n = lay.tp
            if lay.a2a_backend == "deepep":
                per_gpu = tokens / lay.attn_dp * k * self.h * 3 * (ep - 1) / ep  # fp8 dispatch + bf16 combine
                total += self.moe_layers * (2 * self.comm_lat + per_gpu / self.link_bw)
            else:
                nbytes = tokens * self.h * 2
                total += self.moe_layers * 2 * (self.comm_lat + (n - 1) / n * nbytes / self.link_bw)
        if len(self._moe_cache) < 100000:
            self._moe_cache[tokens] = total
        return total

    # ---- one synchronised step of all ranks -------------------------------------------------
    def step_time(self, ranks: list[RankWork], running: int = 0) -> float:
        worst = 0.0
        tokens = 0
        prefill = False
        max_bs = 0
        for w in ranks:
            rt = self.rank_time(w)
            if rt > worst:
                worst = rt
            tokens += w.tokens
            if w.prefill_tokens:
                prefill = True
            if w.decode_reqs > max_bs:
                max_bs = w.decode_reqs
        t = worst + self.moe_time(tokens) + self.step_s + self.dp_sync_s + self.per_req_s * running
        if prefill:
            t += self.prefill_ov_s
        elif max_bs > self.graph_bs:
            t += self.eager_s  # decode batch larger than the captured CUDA graphs: eager launch
        return t
