"""Operators to time: the interface, and a fake for CPU tests. The real implementation, which
calls SGLang 0.5.17's own kernels on a GPU, is ``tuner.profile.sglang_kernels``."""

from __future__ import annotations

from tuner.sim.opshapes import AttentionShape, Gemm, HostWriteShape, MoEShape

from .timing import Runnable


class Kernels:
    """Builds a ``Runnable`` per operator and size. Implementations allocate what the operator
    reads (weights, KV buffers, indices) and free it when the runnable is dropped."""

    name = "kernels"

    def describe(self) -> dict:
        return {"kernels": self.name}

    def gemm(self, g: Gemm, tokens: int) -> Runnable:
        raise NotImplementedError

    def decode_attention(self, shape: AttentionShape, batch: int, context: int) -> Runnable:
        raise NotImplementedError

    def extend_attention(self, shape: AttentionShape, mode: str, new_tokens: int, prefix: int) -> Runnable:
        raise NotImplementedError

    def moe(self, shape: MoEShape, variant: str, tokens: int, routed_pool: int | None = None) -> Runnable:
        """``routed_pool``: every token picks its top-k among these many experts (a collapsed
        router); None: among all of them, uniformly."""
        raise NotImplementedError

    def layer_misc(self, hidden: int, arch: str, moe: bool, shape: AttentionShape, tokens: int,
                   dense_inter: int) -> Runnable:
        raise NotImplementedError

    def sampling(self, vocab: int, batch: int) -> Runnable:
        raise NotImplementedError

    def hicache_write(self, shape: HostWriteShape, tokens: int) -> Runnable:
        """One HiCache write-through backup of ``tokens`` tokens from the device KV pool to the
        pinned host pool, issued as SGLang's scheduler does; timed on the host (``Timer.host_us``)."""
        raise NotImplementedError


class FakeKernels(Kernels):
    """No GPU work: each runnable carries only what it would time (with ``FakeTimer``)."""

    name = "fake"

    def __init__(self, device: str | None = None):
        self.device = device  # the GPU name it pretends to be (None: no check)

    def describe(self) -> dict:
        return {"kernels": self.name, **({"device": self.device} if self.device else {})}

    def _run(self, **meta) -> Runnable:
        return Runnable(calls=[lambda: None], meta=meta)

    def gemm(self, g, tokens):
        return self._run(op="gemm", n=g.n, k=g.k, tokens=tokens)

    def decode_attention(self, shape, batch, context):
        return self._run(op="decode_attention", batch=batch, context=context)

    def extend_attention(self, shape, mode, new_tokens, prefix):
        return self._run(op="extend_attention", mode=mode, new_tokens=new_tokens, prefix=prefix)

    def moe(self, shape, variant, tokens, routed_pool=None):
        return self._run(op="moe", variant=variant, tokens=tokens, routed_pool=routed_pool)

    def layer_misc(self, hidden, arch, moe, shape, tokens, dense_inter):
        return self._run(op="layer_misc", tokens=tokens)

    def sampling(self, vocab, batch):
        return self._run(op="sampling", batch=batch)

    def hicache_write(self, shape, tokens):
        return self._run(op="hicache_write", tokens=tokens, page_size=shape.page_size)
