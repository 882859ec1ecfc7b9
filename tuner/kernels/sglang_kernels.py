"""SGLang's own Triton kernels as timing problems (imports torch and sglang; GPU only).

* ``SGLangMoE``: the whole ``fused_experts`` call exactly as SGLang's Triton MoE runner makes it
  (``moe_runner/triton.py``): ``moe_align_block_size``, the gate/up GEMM, SiLU-and-mul, the down GEMM
  with the router weights, and the top-k sum; in place on the hidden states, with the runner's
  ``MoeRunnerConfig`` (``num_experts`` vs ``num_local_experts`` decides SGLang's expert filter).
  The tile configs reach SGLang's own look-up point: ``try_get_optimal_moe_config`` (as the module
  imported it) answers the candidate up config and, separately, the candidate ``_down`` config. A
  candidate used for both GEMMs goes through SGLang's public ``override_config``, as its tuner does.
* ``SGLangBlockGemm``: ``w8a8_block_fp8_matmul_triton`` (fp8 activations and weights, 128x128 weight
  blocks, bf16 out), the config answered at ``get_w8a8_block_fp8_configs``.

Routing follows SGLang's tuner by default: a random gating matrix, softmax, top-k, renormalised;
``Routing.SERVING`` instead pins the fused shared expert in the last top-k column the way the
server's top-k does, and ``Routing.COLLAPSED`` also draws the routed top-k from a small pool of
experts (``routed_pool``), as a biased gate under random weights routes every token. Each rotation draws new routing (MoE) or new weights (GEMM), so weights do not
stay in L2 across calls. The in-place call overwrites its input, so each launch first restores it
from a pristine copy; that copy is timed alone (``baseline``) and subtracted.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from enum import Enum

import torch

from tuner.kernels.gemm_shapes import GemmShape
from tuner.kernels.shapes import MoEShape
from tuner.kernels.space import DownTileConfig, TileConfig

ROTATIONS = 8
FP8 = torch.float8_e4m3fn


class Routing(str, Enum):
    SGLANG_TUNER = "sglang-tuner"  # top-k of a random gating over every local expert slot
    SERVING = "serving"  # routed top-k over routed experts; fused shared expert(s) always picked
    # as SERVING, with the routed top-k drawn from the same few experts for every token (a new pool each
    # draw, as each layer has its own): a biased gate's routing under random weights
    COLLAPSED = "collapsed"


_runtime = None


class SGLangRuntime:
    """What SGLang's kernels need in a process that is not a server: the published ServerArgs."""

    def __init__(self):
        import sglang  # noqa: F401 - fail here, clearly, if it is missing
        from sglang.srt.server_args import ServerArgs

        from tuner.kernels.sglang_env import installed_sglang

        installed = installed_sglang()
        if installed is None:
            raise RuntimeError("sglang is importable but its package directory has no fused-MoE configs")
        self.installed = installed
        self.layout = installed.layout
        # model_path "dummy" stops ServerArgs.__post_init__ before any model or GPU probing, and the
        # defaults are what a server has unless told otherwise (no deterministic inference, no fused
        # MoE-sum all-reduce).
        args = ServerArgs(model_path="dummy")
        try:
            from sglang.srt.runtime_context import publish

            publish(args, role="test")
        except ImportError:
            from sglang.srt.server_args import set_global_server_args_for_scheduler

            set_global_server_args_for_scheduler(args)
        self.moe = importlib.import_module(self.layout.moe_kernel_import)
        self.triton_utils = importlib.import_module("sglang.srt.layers.moe.moe_runner.triton_utils")
        self.gemm = importlib.import_module(self.layout.gemm_kernel_import)
        from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

        self.MoeRunnerConfig = MoeRunnerConfig
        try:
            from sglang.srt.layers.moe.topk import StandardTopKOutput

            self.TopKOutput = StandardTopKOutput
        except ImportError:
            self.TopKOutput = None
        try:
            from sglang.kernels.ops.moe.fused_moe_triton_kernels import support_tensor_descriptor

            self.tma_supported = bool(support_tensor_descriptor())
        except ImportError:
            self.tma_supported = False

    @property
    def version(self) -> str:
        return self.installed.version


def runtime() -> SGLangRuntime:
    global _runtime
    if _runtime is None:
        _runtime = SGLangRuntime()
    return _runtime


def sglang_failure(exc: BaseException) -> bool:
    """Any error from one candidate's launch rules that candidate out, except CUDA faults (which
    poison the context) and programming errors in this module."""
    text = str(exc)
    if "illegal memory access" in text or "device-side assert" in text:
        return False
    return not isinstance(exc, (NameError, AttributeError, TypeError))


def _weight(size, gen, device, fp8: bool, fan_in: int):
    w = torch.randn(size, generator=gen, device=device, dtype=torch.float32) / math.sqrt(fan_in)
    return w.to(FP8) if fp8 else w.to(torch.bfloat16)


def _blocks(n: int, b: int) -> int:
    return -(-n // b)


class SGLangMoE:
    """SGLang's fused-MoE call for one shape; inputs per batch size built once."""

    def __init__(self, shape: MoEShape, *, routing: Routing = Routing.SGLANG_TUNER, seed: int = 0,
                 device: str = "cuda", rotations: int = ROTATIONS, empty_weights: bool = False,
                 routed_pool: int | None = None):
        self.routing = Routing(routing)
        if self.routing is Routing.COLLAPSED and not (
                routed_pool is not None and shape.routed_topk <= routed_pool <= shape.routed_experts):
            raise ValueError(f"collapsed routing needs a routed pool of {shape.routed_topk}-{shape.routed_experts} "
                             f"experts, got {routed_pool}")
        self.routed_pool = routed_pool
        rt = runtime()
        self.rt = rt
        self.shape = shape
        self.rotations = rotations
        self.device = torch.device(device)
        self.fp8 = shape.dtype == "fp8_w8a8"
        self.block_shape = list(shape.block_shape) if shape.block_shape else None
        E, N, K = shape.num_experts, shape.intermediate, shape.hidden
        gen = torch.Generator(device=self.device).manual_seed(seed)
        if empty_weights:  # compile workers: values never matter, memory is allocated all the same
            dt = FP8 if self.fp8 else torch.bfloat16
            self.w1 = torch.empty((E, 2 * N, K), device=self.device, dtype=dt)
            self.w2 = torch.empty((E, K, N), device=self.device, dtype=dt)
        else:
            self.w1 = _weight((E, 2 * N, K), gen, self.device, self.fp8, K)
            self.w2 = _weight((E, K, N), gen, self.device, self.fp8, N)
        self.w1_scale = self.w2_scale = None
        if self.fp8:
            if self.block_shape:
                bn, bk = self.block_shape
                s1, s2 = (E, _blocks(2 * N, bn), _blocks(K, bk)), (E, _blocks(K, bn), _blocks(N, bk))
            else:
                s1 = s2 = (E,)
            self.w1_scale = torch.rand(s1, generator=gen, device=self.device) * 0.01 + 0.005
            self.w2_scale = torch.rand(s2, generator=gen, device=self.device) * 0.01 + 0.005
        # The runner's config for this layer: experts counted as the server counts them (global vs local)
        global_experts = shape.routed_experts * shape.ep_size + shape.fused_shared_experts
        self.runner_config = rt.MoeRunnerConfig(
            num_experts=global_experts, num_local_experts=E, hidden_size=K, intermediate_size_per_partition=N,
            top_k=shape.topk, num_fused_shared_experts=shape.fused_shared_experts,
            params_dtype=torch.bfloat16, inplace=True)
        self._batch: dict[int, dict] = {}
        props = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)

    def rotations_for(self, M: int) -> int:
        """Routing draws timed at M (``MoEShape.timing_rotations``), at most ``rotations``."""
        return min(self.rotations, self.shape.timing_rotations(M, self.l2_bytes, most=self.rotations))

    # -- inputs --------------------------------------------------------------------------------------
    def _routing(self, M: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.shape
        dev = self.device
        if self.routing is Routing.SGLANG_TUNER or (self.routing is Routing.SERVING and not s.fused_shared_experts):
            logits = torch.randn(M, s.num_experts, generator=gen, device=dev)
            w, ids = torch.softmax(logits, -1).topk(s.topk, -1)
        else:
            if self.routing is Routing.COLLAPSED:
                pool = torch.randperm(s.routed_experts, generator=gen, device=dev)[: self.routed_pool]
                logits = torch.randn(M, self.routed_pool, generator=gen, device=dev)
                w, picked = torch.softmax(logits, -1).topk(s.routed_topk, -1)
                ids = pool[picked]
            else:
                logits = torch.randn(M, s.routed_experts, generator=gen, device=dev)
                w, ids = torch.softmax(logits, -1).topk(s.routed_topk, -1)
            if s.fused_shared_experts:  # the last column names a shared slot, weighted as the routed sum
                shared = s.routed_experts + torch.randint(0, s.fused_shared_experts, (M, 1), generator=gen, device=dev)
                ids = torch.cat([ids, shared], 1)
                w = torch.cat([w, w.sum(-1, keepdim=True)], 1)
        w = w / w.sum(-1, keepdim=True)
        return w.float().contiguous(), ids.to(torch.int32).contiguous()

    def batch(self, M: int) -> dict:
        if M in self._batch:
            return self._batch[M]
        gen = torch.Generator(device=self.device).manual_seed(1000 + M)
        x0 = torch.randn(M, self.shape.hidden, generator=gen, device=self.device).to(torch.bfloat16)
        rots = []
        for _ in range(self.rotations_for(M)):
            w, ids = self._routing(M, gen)
            router_logits = torch.empty((M, self.shape.num_experts), device=self.device, dtype=torch.float32)
            topk = (self.rt.TopKOutput(w, ids, router_logits) if self.rt.TopKOutput else (w, ids, router_logits))
            rots.append(topk)
        b = {"x0": x0, "x": torch.empty_like(x0), "rotations": rots}
        self._batch[M] = b
        return b

    def drop_batch(self, M: int) -> None:
        self._batch.pop(M, None)

    # -- configs -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def using(self, config):
        """Make SGLang pick ``config``: a TileConfig for both GEMMs, or (up TileConfig, down DownTileConfig)."""
        if isinstance(config, TileConfig):
            with self.rt.triton_utils.override_config(config.as_dict()):
                yield
            return
        up, down = config
        if down is not None and down.BLOCK_SIZE_M != up.BLOCK_SIZE_M:
            raise ValueError("the down config's BLOCK_SIZE_M must equal the up config's (one shared sort)")
        module = self.rt.moe
        original = module.try_get_optimal_moe_config

        def answer(*args, return_down_config: bool = False, **kwargs):
            cfg = up.as_dict()
            if not return_down_config:
                return cfg
            d = down.as_dict() if down is not None else None  # a fresh dict: SGLang pops USE_TMA
            return cfg, (d, d["BLOCK_SIZE_M"] if d else None)

        module.try_get_optimal_moe_config = answer
        try:
            yield
        finally:
            module.try_get_optimal_moe_config = original

    is_config_failure = staticmethod(sglang_failure)

    # -- calls ---------------------------------------------------------------------------------------
    def baseline(self, M: int, rotation: int) -> None:
        b = self.batch(M)
        b["x"].copy_(b["x0"])

    def launch(self, M: int, config=None, rotation: int = 0) -> torch.Tensor:
        """One fused_experts call (the config comes from ``using``, active around this call)."""
        b = self.batch(M)
        x = b["x"]
        x.copy_(b["x0"])
        return self.call(x, b["rotations"][rotation])

    def call(self, x: torch.Tensor, topk_output) -> torch.Tensor:
        return self.rt.moe.fused_experts(
            hidden_states=x, w1=self.w1, w2=self.w2, topk_output=topk_output,
            moe_runner_config=self.runner_config, use_fp8_w8a8=self.fp8, w1_scale=self.w1_scale,
            w2_scale=self.w2_scale, block_shape=self.block_shape)


class SGLangBlockGemm:
    """SGLang's block-fp8 GEMM for one (N, K): C[M, N] = A[M, K] @ B[N, K]^T, bf16 out."""

    def __init__(self, shape: GemmShape, *, seed: int = 0, device: str = "cuda", rotations: int = ROTATIONS):
        rt = runtime()
        self.rt = rt
        self.shape = shape
        self.rotations = rotations
        self.device = torch.device(device)
        N, K = shape.N, shape.K
        bn, bk = shape.block_shape
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.weights = []
        for _ in range(rotations):  # one weight per rotation: a model's layers each have their own
            B = _weight((N, K), gen, self.device, True, K)
            Bs = torch.rand((_blocks(N, bn), _blocks(K, bk)), generator=gen, device=self.device) * 0.01 + 0.005
            self.weights.append((B, Bs))
        self._batch: dict[int, tuple] = {}

    def batch(self, M: int):
        if M not in self._batch:
            gen = torch.Generator(device=self.device).manual_seed(2000 + M)
            bk = self.shape.block_shape[1]
            A = (torch.randn(M, self.shape.K, generator=gen, device=self.device) * 0.5).to(FP8)
            As = torch.rand((M, _blocks(self.shape.K, bk)), generator=gen, device=self.device) * 0.01 + 0.005
            self._batch[M] = (A, As)
        return self._batch[M]

    def drop_batch(self, M: int) -> None:
        self._batch.pop(M, None)

    @contextlib.contextmanager
    def using(self, config: TileConfig):
        module = self.rt.gemm
        original = module.get_w8a8_block_fp8_configs

        def answer(N, K, block_n, block_k):
            return {1: config.as_dict()}  # the only key: every M picks it

        module.get_w8a8_block_fp8_configs = answer
        try:
            yield
        finally:
            module.get_w8a8_block_fp8_configs = original

    is_config_failure = staticmethod(sglang_failure)

    def launch(self, M: int, config=None, rotation: int = 0) -> torch.Tensor:
        A, As = self.batch(M)
        B, Bs = self.weights[rotation]
        return self.rt.gemm.w8a8_block_fp8_matmul_triton(A, B, As, Bs, list(self.shape.block_shape),
                                                         output_dtype=torch.bfloat16)


def reference_moe(problem: SGLangMoE, M: int, rotation: int = 0) -> torch.Tensor:
    """Plain torch float32 MoE of the problem's weights (dequantized) for one routing draw."""
    s = problem.shape
    b = problem.batch(M)
    w, ids, _ = b["rotations"][rotation]
    x = b["x0"].float()

    def deq(wq, scale):
        if not problem.fp8:
            return wq.float()
        if problem.block_shape:
            bn, bk = problem.block_shape
            E, R, C = wq.shape
            sc = scale.repeat_interleave(bn, 1)[:, :R].repeat_interleave(bk, 2)[:, :, :C]
            return wq.float() * sc
        return wq.float() * scale.view(-1, 1, 1)

    w1, w2 = deq(problem.w1, problem.w1_scale), deq(problem.w2, problem.w2_scale)
    out = torch.zeros(M, s.hidden, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = x[tok] @ w1[e].T
        act = torch.nn.functional.silu(h[:, : s.intermediate]) * h[:, s.intermediate:]
        out.index_add_(0, tok, (act @ w2[e].T) * w[tok, slot][:, None])
    return out


def reference_gemm(problem: SGLangBlockGemm, M: int, rotation: int = 0) -> torch.Tensor:
    A, As = problem.batch(M)
    B, Bs = problem.weights[rotation]
    bn, bk = problem.shape.block_shape
    a = A.float() * As.repeat_interleave(bk, 1)[:, : problem.shape.K]
    bsc = Bs.repeat_interleave(bn, 0)[: problem.shape.N].repeat_interleave(bk, 1)[:, : problem.shape.K]
    return a @ (B.float() * bsc).T
