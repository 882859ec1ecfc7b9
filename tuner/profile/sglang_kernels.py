"""SGLang 0.5.17's own kernels at the shapes one GPU sees (GPU only; imports torch and sglang).

What each operator calls, read from the 0.5.17 source:

* linear layers: bf16 ``torch.nn.functional.linear`` (``UnquantizedLinearMethod.apply``); fp8
  block-quantized weights through ``dispatch_w8a8_block_fp8_linear()``
  (``Fp8LinearMethod.apply``: DeepGEMM when enabled, else the Triton block-FP8 GEMM), weight
  ``[n, k]`` e4m3 with ``weight_scale_inv [n/128, k/128]``;
* decode attention: ``decode_attention_fwd`` (``TritonAttnBackend.forward_decode``) with the
  backend's buffers: ``attn_logits [bs, heads, max_kv_splits, v_dim]`` and ``attn_lse`` in fp32,
  ``num_kv_splits`` from ``get_num_kv_splits_triton`` (computed once per step, outside the timed
  call), ``max_kv_splits`` as ``TritonAttnBackend.__init__`` sets it (8, or the MLA cap); the KV
  pool is ``[tokens, kv_heads, head_dim]`` (MHA) or ``[tokens, 1, kv_lora + rope]`` with the value
  a view of its first ``kv_lora`` dims (MLA);
* extend attention: ``extend_attention_fwd`` (``TritonAttnBackend.forward_extend``), causal, no
  custom mask, ``qo_indptr`` int64 / ``kv_indptr`` int32 / ``kv_indices`` int64; for MLA the MHA
  form (expanded K/V, ``forward_normal``) without a cached prefix and the absorbed form (latent
  K/V) with one (``handle_attention_triton``);
* fused MoE: ``fused_experts_impl`` (the Triton runner), with SGLang's own tile choice
  (``try_get_optimal_moe_config``: its shipped configs, else ``get_default_config``) as
  ``default``, and tuner's tuned files through ``override_config`` as ``tuned``;
* per-layer small kernels: SGLang's ``RMSNorm`` (fused add) twice, rotary embedding on q and k,
  ``SiluAndMul`` of the dense/shared MLP, and the router's top-k; sampling: softmax + argmax over
  the vocabulary shard (``--sampling-backend pytorch``, greedy).

SGLang's runtime (server args, a one-rank process group) is initialised once, as its own
encode server does, because the MoE runner reads the TP group and the execution config.
"""

from __future__ import annotations

import math
import os

from tuner.backends.process import free_port
from tuner.catalog import GPUDescription, ModelDescription
from tuner.planner.startup import triton_max_kv_splits
from tuner.sim.opshapes import HICACHE_STAGING_PAGES, AttentionShape, Gemm, HostWriteShape, MoEShape

from .kernels import Kernels
from .timing import Runnable
from tuner.kernels.configfile import config_relpath, nearest_config, read_configs

MAX_ROTATIONS = 8


class SGLangKernels(Kernels):
    name = "sglang"

    def __init__(self, model: ModelDescription, gpu: GPUDescription, *, model_dir: str, flags: dict, kv_cache_dtype: str,
                 tuned_moe_dir: str | None = None, max_kv_tokens: int = 16 << 20, seed: int = 0):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("tuner profile needs a CUDA GPU")
        self.torch = torch
        self.model, self.gpu = model, gpu
        self.device = torch.device("cuda")
        self.max_kv_tokens = max_kv_tokens
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.kv_dtype = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                         "fp8_e5m2": torch.float8_e5m2}.get(kv_cache_dtype)
        if self.kv_dtype is None:
            raise ValueError(f"kv-cache-dtype {kv_cache_dtype!r} is not profiled (bf16, fp8_e4m3, fp8_e5m2)")
        props = torch.cuda.get_device_properties(0)
        self.sm_count = props.multi_processor_count
        self.l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
        self.tuned_moe_dir = tuned_moe_dir
        self._init_runtime(model_dir, flags, kv_cache_dtype)
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
        from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

        self.decode_attention_fwd = decode_attention_fwd
        self.extend_attention_fwd = extend_attention_fwd
        self.get_num_kv_splits_triton = get_num_kv_splits_triton
        try:
            from sgl_kernel.utils import is_arch_support_pdl

            self.use_pdl = bool(is_arch_support_pdl())
        except Exception:
            self.use_pdl = False
        self._fp8_linear = None
        self._impl = {}

    # ---- runtime ------------------------------------------------------------------------------
    def _init_runtime(self, model_dir: str, flags: dict, kv_cache_dtype: str) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
        from sglang.srt.layers.dp_attention import initialize_dp_attention
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        kwargs = dict(model_path=model_dir, load_format="dummy", skip_tokenizer_init=True, tp_size=1,
                      attention_backend=str(flags.get("attention-backend") or "triton"),
                      sampling_backend="pytorch",
                      kv_cache_dtype="auto" if kv_cache_dtype == "bf16" else kv_cache_dtype)
        if flags.get("quantization"):
            kwargs["quantization"] = flags["quantization"]
        self.server_args = ServerArgs(**kwargs)
        set_global_server_args_for_scheduler(self.server_args)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        init_distributed_environment(backend="nccl", world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        initialize_model_parallel(tensor_model_parallel_size=1)
        initialize_dp_attention(self.server_args, ModelConfig.from_server_args(self.server_args))

    def describe(self) -> dict:
        import torch

        try:
            import sglang

            version = sglang.__version__
        except Exception:
            version = "unknown"
        try:
            import triton

            triton_version = triton.__version__
        except Exception:
            triton_version = "unknown"
        return {"kernels": "sglang", "sglang": version, "torch": torch.__version__, "triton": triton_version,
                "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0), "sm_count": self.sm_count,
                "implementations": dict(self._impl)}

    # ---- helpers ------------------------------------------------------------------------------
    def _randn(self, *shape, dtype=None, scale=0.05):
        t = self.torch.randn(*shape, generator=self.gen, device=self.device, dtype=self.torch.float32) * scale
        return t.to(dtype or self.torch.bfloat16)

    def _rotations(self, bytes_read: float) -> int:
        """Enough copies that one pass over them does not fit in L2."""
        if bytes_read <= 0:
            return 1
        return max(1, min(MAX_ROTATIONS, math.ceil(2 * self.l2_bytes / bytes_read)))

    # ---- linear layers ------------------------------------------------------------------------
    def gemm(self, g: Gemm, tokens: int) -> Runnable:
        torch = self.torch
        bpp = {"bf16": 2.0, "fp8_block": 1.0}.get(g.dtype)
        if bpp is None:
            raise ValueError(f"GEMM dtype {g.dtype} is not profiled on this GPU")
        rot = self._rotations(g.n * g.k * bpp)
        calls, keep = [], []
        if g.dtype == "bf16":
            import torch.nn.functional as F

            self._impl["gemm_bf16"] = "torch.nn.functional.linear"
            for _ in range(rot):
                x, w = self._randn(tokens, g.k), self._randn(g.n, g.k)
                keep += [x, w]
                calls.append(lambda x=x, w=w: F.linear(x, w))
        else:
            if self._fp8_linear is None:
                from sglang.srt.layers.quantization.fp8_utils import dispatch_w8a8_block_fp8_linear

                self._fp8_linear = dispatch_w8a8_block_fp8_linear()
                self._impl["gemm_fp8_block"] = getattr(self._fp8_linear, "__name__", str(self._fp8_linear))
            lin = self._fp8_linear
            for _ in range(rot):
                x = self._randn(tokens, g.k)
                w = self._randn(g.n, g.k, dtype=torch.float8_e4m3fn, scale=1.0)
                s = (torch.rand(-(-g.n // 128), -(-g.k // 128), generator=self.gen, device=self.device) * 0.01
                     + 0.001)
                keep += [x, w, s]
                calls.append(lambda x=x, w=w, s=s: lin(input=x, weight=w, block_size=[128, 128], weight_scale=s,
                                                       input_scale=None, bias=None))
        return Runnable(calls=calls, meta={"op": "gemm", "n": g.n, "k": g.k, "tokens": tokens}, keep=keep)

    # ---- attention ----------------------------------------------------------------------------
    def _kv_buffers(self, tokens: int, heads: int, k_dim: int, v_dim: int, mla: bool):
        if mla:
            kv = self._randn(tokens, 1, k_dim, dtype=self.kv_dtype)
            return kv, kv[..., :v_dim], [kv]
        k = self._randn(tokens, heads, k_dim, dtype=self.kv_dtype)
        v = self._randn(tokens, heads, v_dim, dtype=self.kv_dtype)
        return k, v, [k, v]

    def decode_attention(self, shape: AttentionShape, batch: int, context: int) -> Runnable:
        torch = self.torch
        mla = shape.arch == "mla"
        H, Hkv, Dk, Dv = shape.q_heads, shape.kv_heads, shape.qk_head_dim, shape.v_head_dim
        elem = torch.empty((), dtype=self.kv_dtype).element_size()
        per_token = (Dk if mla else Hkv * (Dk + Dv)) * elem
        rot = self._rotations(batch * context * per_token)
        buf_tokens = min(batch * context * rot, self.max_kv_tokens)
        if buf_tokens < context:
            raise MemoryError(f"context {context} exceeds the KV buffer budget {self.max_kv_tokens} tokens")
        k_buf, v_buf, keep = self._kv_buffers(buf_tokens, Hkv, Dk, Dv, mla)
        max_splits = triton_max_kv_splits(self.model, self.gpu, self.model.max_context_tokens,
                                          self.server_args.triton_attention_num_kv_splits)
        self._impl["decode_attention"] = "sglang.kernels.ops.attention.decode_attention.decode_attention_fwd"
        sm_scale = 1.0 / math.sqrt(shape.mha_qk_head_dim if mla else Dk)
        span = buf_tokens - context + 1
        calls = []
        for r in range(rot):
            starts = torch.tensor([((r * batch + i) * context) % span for i in range(batch)], device=self.device,
                                  dtype=torch.int64)
            kv_indices = (starts[:, None] + torch.arange(context, device=self.device, dtype=torch.int64)).reshape(-1)
            kv_indptr = torch.arange(batch + 1, device=self.device, dtype=torch.int32) * context
            q = self._randn(batch, H, Dk)
            o = torch.empty(batch, H, Dv, device=self.device, dtype=torch.bfloat16)
            logits = torch.empty(batch, H, max_splits, Dv, device=self.device, dtype=torch.float32)
            lse = torch.empty(batch, H, max_splits, device=self.device, dtype=torch.float32)
            splits = torch.empty(batch, device=self.device, dtype=torch.int32)
            seq_lens = torch.full((batch,), context, device=self.device, dtype=torch.int32)
            sched = 256 if batch < 256 else 1 << (batch - 1).bit_length()
            self.get_num_kv_splits_triton[(1,)](splits, seq_lens, batch, 1, H, Hkv, max_splits, self.sm_count,
                                                MAX_NUM_SEQ=sched)
            keep += [kv_indices, kv_indptr, q, o, logits, lse, splits, seq_lens]
            calls.append(lambda q=q, o=o, ip=kv_indptr, ix=kv_indices, lg=logits, ls=lse, sp=splits:
                         self.decode_attention_fwd(q, k_buf, v_buf, o, ip, ix, lg, ls, sp, max_splits, sm_scale,
                                                   1.0, 1.0, logit_cap=0.0, sinks=None, xai_temperature_len=-1,
                                                   has_mla=mla, use_pdl=self.use_pdl, page_size=1))
        return Runnable(calls=calls, meta={"op": "decode_attention", "batch": batch, "context": context,
                                           "max_kv_splits": max_splits}, keep=keep)

    def extend_attention(self, shape: AttentionShape, mode: str, new_tokens: int, prefix: int) -> Runnable:
        torch = self.torch
        mla = shape.arch == "mla"
        if mode == "absorbed":
            Hq, Hkv, Dk, Dv = shape.q_heads, 1, shape.qk_head_dim, shape.v_head_dim
        else:
            Hq = shape.q_heads
            Hkv = shape.q_heads if mla else shape.kv_heads  # MLA's MHA form expands K/V per head
            Dk, Dv = shape.mha_qk_head_dim, shape.mha_v_head_dim
        if prefix + new_tokens > self.max_kv_tokens:
            raise MemoryError(f"prefix {prefix} + {new_tokens} exceeds the KV buffer budget")
        k_buf, v_buf, keep = self._kv_buffers(max(prefix, 1), Hkv, Dk, Dv, mla and mode == "absorbed")
        self._impl["extend_attention"] = "sglang.kernels.ops.attention.extend_attention.extend_attention_fwd"
        q = self._randn(new_tokens, Hq, Dk)
        k_ext = self._randn(new_tokens, Hkv, Dk)
        v_ext = self._randn(new_tokens, Hkv, Dv)
        o = torch.empty(new_tokens, Hq, Dv, device=self.device, dtype=torch.bfloat16)
        qo_indptr = torch.tensor([0, new_tokens], device=self.device, dtype=torch.int64)
        kv_indptr = torch.tensor([0, prefix], device=self.device, dtype=torch.int32)
        kv_indices = torch.arange(prefix, device=self.device, dtype=torch.int64)
        keep += [q, k_ext, v_ext, o, qo_indptr, kv_indptr, kv_indices]
        sm_scale = 1.0 / math.sqrt(shape.mha_qk_head_dim)
        call = lambda: self.extend_attention_fwd(q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
                                                 None, True, None, new_tokens, 1.0, 1.0, sm_scale, logit_cap=0.0,
                                                 page_size=1)
        return Runnable(calls=[call], meta={"op": "extend_attention", "mode": mode, "new_tokens": new_tokens,
                                            "prefix": prefix}, keep=keep)

    # ---- fused MoE ----------------------------------------------------------------------------
    def moe(self, shape: MoEShape, variant: str, tokens: int, routed_pool: int | None = None) -> Runnable:
        torch = self.torch
        from sglang.srt.layers.moe.moe_runner.triton_utils import override_config
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts_impl

        E, N, K, topk = shape.experts, shape.n, shape.k, shape.topk
        fp8 = shape.dtype == "fp8_block"
        if shape.dtype not in ("bf16", "fp8_block"):
            raise ValueError(f"MoE weight format {shape.dtype} is not profiled with the Triton runner")
        wdtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        w1 = self._randn(E, 2 * N, K, dtype=wdtype, scale=1.0 if fp8 else 0.05)
        w2 = self._randn(E, K, N, dtype=wdtype, scale=1.0 if fp8 else 0.05)
        s1 = s2 = None
        if fp8:
            s1 = torch.rand(E, -(-2 * N // 128), -(-K // 128), generator=self.gen, device=self.device) * 0.01 + 1e-3
            s2 = torch.rand(E, -(-K // 128), -(-N // 128), generator=self.gen, device=self.device) * 0.01 + 1e-3
        config = None
        if variant == "tuned":
            config = self._tuned_config(shape, tokens)
        self._impl["moe"] = "sglang fused_experts_impl (Triton), tiles: " + (
            "tuner tuned files" if variant == "tuned" else "SGLang's own choice")
        rot = max(1, min(MAX_ROTATIONS, self._rotations(tokens * topk * 2 * N * K * (1 if fp8 else 2) / E)))
        calls, keep = [], [w1, w2, s1, s2]
        for _ in range(rot):
            x = self._randn(tokens, K)
            if routed_pool:  # a collapsed router: each token's top-k among the same few experts
                pool = torch.randperm(E, generator=self.gen, device=self.device)[:routed_pool]
                ids = torch.stack([pool[torch.randperm(routed_pool, generator=self.gen, device=self.device)[:topk]]
                                   for _ in range(tokens)]).to(torch.int32)
                self._impl["moe_routing"] = f"collapsed: top-{topk} of the same {routed_pool} experts per call"
            else:
                ids = torch.stack([torch.randperm(E, generator=self.gen, device=self.device)[:topk]
                                   for _ in range(tokens)]).to(torch.int32)
            wts = torch.softmax(torch.rand(tokens, topk, generator=self.gen, device=self.device), dim=-1)
            keep += [x, ids, wts]

            def call(x=x, ids=ids, wts=wts):
                kwargs = dict(inplace=False, activation="silu", use_fp8_w8a8=fp8, w1_scale=s1, w2_scale=s2,
                              block_shape=[128, 128] if fp8 else None)
                if config is not None:
                    with override_config(config):
                        return fused_experts_impl(x, w1, w2, wts, ids, **kwargs)
                return fused_experts_impl(x, w1, w2, wts, ids, **kwargs)

            calls.append(call)
        return Runnable(calls=calls, meta={"op": "moe", "variant": variant, "tokens": tokens}, keep=keep)

    def _tuned_config(self, shape: MoEShape, tokens: int) -> dict:
        import triton


        if not self.tuned_moe_dir:
            raise ValueError("the tuned MoE variant needs --tuned-moe-dir (tuner kernels tune output)")
        dtype = "fp8_w8a8" if shape.dtype == "fp8_block" else None
        rel = config_relpath(shape.experts, shape.n, self.torch.cuda.get_device_name(0), triton.__version__,
                             dtype=dtype, block_shape=[128, 128] if dtype else None)
        return nearest_config(read_configs(os.path.join(self.tuned_moe_dir, rel)), tokens)

    # ---- small kernels ----------------------------------------------------------------------
    def layer_misc(self, hidden: int, arch: str, moe: bool, shape: AttentionShape, tokens: int,
                   dense_inter: int) -> Runnable:
        torch = self.torch
        ops = []
        keep = []
        x, res = self._randn(tokens, hidden), self._randn(tokens, hidden)
        keep += [x, res]
        try:
            from sglang.srt.layers.layernorm import RMSNorm

            norm = RMSNorm(hidden).to(self.device, torch.bfloat16)
            ops.append(lambda: norm(x, res))
            ops.append(lambda: norm(x, res))
            self._impl["norm"] = "sglang RMSNorm (fused add)"
        except Exception as exc:
            self._impl["norm"] = f"torch (SGLang RMSNorm unavailable: {type(exc).__name__})"
            ops.append(lambda: torch.nn.functional.rms_norm(x + res, (hidden,)))
            ops.append(lambda: torch.nn.functional.rms_norm(x + res, (hidden,)))
        rope_dim = self.model.qk_rope_head_dim if self.model.is_mla else shape.qk_head_dim
        q = self._randn(tokens, shape.q_heads * rope_dim)
        k = self._randn(tokens, (1 if self.model.is_mla else shape.kv_heads) * rope_dim)
        pos = torch.arange(tokens, device=self.device, dtype=torch.int64)
        keep += [q, k, pos]
        try:
            from sglang.srt.layers.rotary_embedding import get_rope

            rope = get_rope(rope_dim, rope_dim, 1 << 17, 10000, is_neox_style=not self.model.is_mla,
                            dtype=torch.bfloat16).to(self.device)
            ops.append(lambda: rope(pos, q, k))
            self._impl["rope"] = "sglang get_rope"
        except Exception as exc:
            self._impl["rope"] = f"torch (SGLang rotary unavailable: {type(exc).__name__})"
            ops.append(lambda: (q * 1.0001, k * 1.0001))
        if dense_inter:
            gate_up = self._randn(tokens, 2 * dense_inter)
            keep.append(gate_up)
            try:
                from sglang.srt.layers.activation import SiluAndMul

                act = SiluAndMul()
                ops.append(lambda: act(gate_up))
                self._impl["activation"] = "sglang SiluAndMul"
            except Exception as exc:
                self._impl["activation"] = f"torch (SGLang SiluAndMul unavailable: {type(exc).__name__})"
                ops.append(lambda: torch.nn.functional.silu(gate_up[:, :dense_inter]) * gate_up[:, dense_inter:])
        if moe:
            logits = self._randn(tokens, self.model.n_routed_experts)
            keep.append(logits)
            kk = self.model.experts_per_token
            ops.append(lambda: torch.topk(torch.softmax(logits.float(), dim=-1), kk, dim=-1))
            self._impl["routing"] = "torch softmax + topk"

        def call():
            for op in ops:
                op()

        return Runnable(calls=[call], meta={"op": "layer_misc", "tokens": tokens}, keep=keep)

    def sampling(self, vocab: int, batch: int) -> Runnable:
        torch = self.torch
        logits = self._randn(batch, vocab)
        self._impl["sampling"] = "torch softmax + argmax (greedy, --sampling-backend pytorch)"
        return Runnable(calls=[lambda: torch.argmax(torch.softmax(logits.float(), dim=-1), dim=-1)],
                        meta={"op": "sampling", "batch": batch}, keep=[logits])

    # ---- HiCache write-through ------------------------------------------------------------------
    def hicache_write(self, shape: HostWriteShape, tokens: int) -> Runnable:
        """``HiCacheController.start_writing`` for the ``kernel`` io backend and the ``page_first``
        host layout: an event on the current stream, then on the write stream SGLang's staged
        write-back (``transfer_hicache_all_layer_staged_lf_pf``, MLA: ``..._mla_staged_lf_pf``) from
        per-layer device buffers (pointer table, as the device pool holds them) to a pinned host
        pool ``[tokens, layers, element]``, device indices of scattered pages, host indices on the
        CPU, as the scheduler passes them. Bytes are bytes: fp8 KV is stored as uint8 in SGLang's
        pool, so every dtype is timed as uint8 of the same element size."""
        torch = self.torch
        from sglang.kernels.ops.kvcache import hicache as hc

        if not hc.can_use_write_back_jit_kernel(element_size=shape.element_bytes):
            raise RuntimeError(f"SGLang's staged write-back kernel cannot run {shape.element_bytes}-byte elements")
        page = shape.page_size
        pages = -(-tokens // page)
        n = pages * page
        pool_pages = max(2 * pages, 64)
        u8 = torch.uint8
        tensors = []
        for _ in range(shape.tensors):
            layers = [torch.empty((pool_pages * page, shape.element_bytes), dtype=u8, device=self.device)
                      for _ in range(shape.layers)]
            ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64, device=self.device)
            host = torch.empty((n, shape.layers, shape.element_bytes), dtype=u8, pin_memory=True)
            staging = torch.empty((HICACHE_STAGING_PAGES * page, shape.layers, shape.element_bytes), dtype=u8,
                                  device=self.device)
            tensors.append((layers, ptrs, host, staging))
        # the pool's free pages after some traffic are scattered: a random choice of them
        chosen = torch.randperm(pool_pages, generator=torch.Generator().manual_seed(tokens))[:pages]
        src = (chosen[:, None] * page + torch.arange(page)[None, :]).reshape(-1).to(self.device)
        dst = torch.arange(n, dtype=torch.int64)  # host indices stay on the CPU
        stream = torch.cuda.Stream()
        if shape.tensors == 2:
            (_, kp, kh, ks), (_, vp, vh, vs) = tensors
            self._impl["hicache_write"] = "sglang transfer_hicache_all_layer_staged_lf_pf"

            def write():
                hc.transfer_hicache_all_layer_staged_lf_pf(kp, vp, src, dst, ks, vs, kh, vh, page_size=page)
        else:
            (_, p, h, st), = tensors
            self._impl["hicache_write"] = "sglang transfer_hicache_all_layer_mla_staged_lf_pf"

            def write():
                hc.transfer_hicache_all_layer_mla_staged_lf_pf(p, src, dst, st, h, page_size=page)

        def call():
            start = torch.cuda.Event()
            start.record()
            with torch.cuda.stream(stream):
                start.wait(stream)
                write()

        return Runnable(calls=[call], meta={"op": "hicache_write", "tokens": tokens, "page_size": page},
                        keep=[tensors, src, dst, stream])

