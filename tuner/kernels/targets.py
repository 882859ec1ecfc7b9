"""What ``tuner kernels tune`` will tune, checked before anything runs or is written (pure CPU)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from tuner.errors import ConfigError
from tuner.paths import user_path
from tuner.kernels.gemm_shapes import GemmShape, gemm_shapes
from tuner.kernels.shapes import MoEShape, moe_shape

#: SGLang's tuning batch sizes (its tuners' default list)
SGLANG_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


class Kernel(str, Enum):
    MOE = "moe"
    GEMM = "gemm"
    ALL = "all"


@dataclass
class TuneTargets:
    moe: MoEShape | None
    gemms: list[GemmShape] = field(default_factory=list)

    def describe(self) -> list[str]:
        out = [f"fused MoE {self.moe.tag} (top-k {self.moe.topk})"] if self.moe else []
        out += [f"block-fp8 GEMM {g.tag}" for g in self.gemms]
        return out


def parse_gemm_shape(text: str) -> tuple[int, int]:
    parts = [p.strip() for p in str(text).replace("x", ",").split(",") if p.strip()]
    try:
        n, k = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"GEMM shape {text!r} is not N,K (two integers, e.g. 5120,2048)", key="gemm_shape") from None
    return n, k


def tune_targets(model: str, tp_size: int, ep_size: int = 1, dtype: str = "bf16",
                 block_shape: tuple[int, int] | None = None, *, kernel: Kernel = Kernel.ALL,
                 disable_shared_experts_fusion: bool = False, attn_tp_size: int | None = None,
                 only_gemm_shapes: list[tuple[int, int]] | None = None) -> TuneTargets:
    kernel = Kernel(kernel)
    moe = None
    if kernel in (Kernel.MOE, Kernel.ALL):
        moe = moe_shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion)
    gemms: list[GemmShape] = []
    block_fp8 = dtype == "fp8_w8a8" and block_shape is not None
    if kernel is Kernel.GEMM and not block_fp8:
        raise ConfigError(f"SGLang's Triton GEMM tiles exist for block-quantized fp8 only (w8a8_block_fp8_matmul); "
                          f"got dtype {dtype} with block shape {list(block_shape) if block_shape else None}; use "
                          f"--dtype fp8_w8a8 --block-shape 128,128", key="dtype")
    if kernel in (Kernel.GEMM, Kernel.ALL) and block_fp8:
        model_shapes = gemm_shapes(model, tp_size, attn_tp_size=attn_tp_size,
                                   disable_shared_experts_fusion=disable_shared_experts_fusion,
                                   block_shape=tuple(block_shape))
        if only_gemm_shapes:
            known = {(g.N, g.K): g for g in model_shapes}
            unknown = [f"{n},{k}" for n, k in only_gemm_shapes if (n, k) not in known]
            if unknown:
                raise ConfigError(f"GEMM shape(s) {unknown} are not linear layers of {model} at this "
                                  f"parallelism; valid: {[f'{g.N},{g.K}' for g in model_shapes]}", key="gemm_shape")
            gemms = [known[s] for s in dict.fromkeys(only_gemm_shapes)]
        else:
            gemms = model_shapes
    if moe is None and not gemms:
        raise ConfigError("nothing to tune", key="kernel")
    return TuneTargets(moe, gemms)


def check_batch_sizes(values: list[int]) -> list[int]:
    if not values:
        raise ConfigError("no batch sizes given", key="batch_sizes")
    bad = [v for v in values if v <= 0]
    if bad:
        raise ConfigError(f"batch sizes must be positive token counts, got {bad}", key="batch_sizes")
    return sorted(set(values))


def check_output_dir(path: str | Path) -> Path:
    """``path`` is, or can be created as, a writable directory; nothing is created here."""
    p = user_path(path).absolute()
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe == p and not p.is_dir():
        raise ConfigError("exists and is not a directory", file=str(p))
    if not probe.is_dir():
        raise ConfigError(f"cannot be created: {probe} is not a directory", file=str(p))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"is not writable ({probe} does not allow writing)", file=str(p))
    try:  # permission bits do not stop root; a read-only or pseudo file system does
        fd, probe_file = tempfile.mkstemp(prefix=".tuner-write-check-", dir=probe)
        os.close(fd)
        os.unlink(probe_file)
    except OSError as exc:
        raise ConfigError(f"is not writable ({probe}: {exc.strerror})", file=str(p)) from None
    return p
