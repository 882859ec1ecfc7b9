"""The tile-configuration space of the fused-MoE Triton kernel, SGLang's default rules and the
shared-memory constraint. Pure CPU: no torch, no triton.

The space is SGLang's ``get_configs_compute_bound`` (benchmark/kernels/fused_moe_triton/common_utils.py)
on CUDA: 5 BLOCK_SIZE_M x 4 BLOCK_SIZE_N x 3 BLOCK_SIZE_K x 4 GROUP_SIZE_M x 2 num_warps x 4 num_stages
= 1,920 configs. With block-wise fp8 its tuner keeps only BLOCK_SIZE_K dividing block_k (1,280 for 128).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from tuner.errors import ConfigError

BLOCK_SIZE_M = (16, 32, 64, 128, 256)
BLOCK_SIZE_N = (32, 64, 128, 256)
BLOCK_SIZE_K = (64, 128, 256)
GROUP_SIZE_M = (1, 16, 32, 64)
NUM_WARPS = (4, 8)
NUM_STAGES = (2, 3, 4, 5)

PARAM_VALUES: dict[str, tuple[int, ...]] = {
    "BLOCK_SIZE_M": BLOCK_SIZE_M,
    "BLOCK_SIZE_N": BLOCK_SIZE_N,
    "BLOCK_SIZE_K": BLOCK_SIZE_K,
    "GROUP_SIZE_M": GROUP_SIZE_M,
    "num_warps": NUM_WARPS,
    "num_stages": NUM_STAGES,
}

# Triton's launch defaults, used when a config (SGLang's bf16 default) leaves them out.
TRITON_DEFAULT_NUM_WARPS = 4
TRITON_DEFAULT_NUM_STAGES = 3

# Opt-in shared memory per block (bytes) by SM version: Hopper and datacenter Blackwell 227 KiB,
# Ampere A100 163 KiB, workstation Blackwell / Ada 99 KiB. The device's own figure wins when known.
SMEM_LIMIT_BYTES_BY_SM = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376}


@dataclass(frozen=True, order=True)
class TileConfig:
    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int = TRITON_DEFAULT_NUM_WARPS
    num_stages: int = TRITON_DEFAULT_NUM_STAGES

    def as_dict(self) -> dict[str, int]:
        """SGLang's key order, as written into its config files."""
        return {k: getattr(self, k) for k in PARAM_VALUES}

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config") -> TileConfig:
        missing = [k for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M") if k not in d]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)}; a tile config needs {', '.join(PARAM_VALUES)}",
                              key=where)
        try:
            return cls(**{k: int(d[k]) for k in PARAM_VALUES if k in d})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"tile config values must be integers ({exc})", key=where) from None

    @property
    def compile_key(self) -> tuple[int, int, int, int, int]:
        """What a compiled kernel depends on: GROUP_SIZE_M is a run-time argument of our kernel."""
        return (self.BLOCK_SIZE_M, self.BLOCK_SIZE_N, self.BLOCK_SIZE_K, self.num_warps, self.num_stages)

    def short(self) -> str:
        return (f"M{self.BLOCK_SIZE_M}-N{self.BLOCK_SIZE_N}-K{self.BLOCK_SIZE_K}-G{self.GROUP_SIZE_M}"
                f"-w{self.num_warps}-s{self.num_stages}")


def sglang_search_space() -> list[TileConfig]:
    """All 1,920 configs of SGLang's CUDA tuning space, in its loop order."""
    return [
        TileConfig(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=s)
        for s, bm, bk, bn, w, g in itertools.product(NUM_STAGES, BLOCK_SIZE_M, BLOCK_SIZE_K, BLOCK_SIZE_N,
                                                     NUM_WARPS, GROUP_SIZE_M)
    ]


def search_space_for(dtype: str, block_shape: tuple[int, int] | None) -> list[TileConfig]:
    """SGLang's space as its tuner uses it for this dtype: block-wise quant keeps block_k % BLOCK_SIZE_K == 0."""
    space = sglang_search_space()
    if dtype == "fp8_w8a8" and block_shape:
        block_k = block_shape[1]
        space = [c for c in space if block_k % c.BLOCK_SIZE_K == 0]
    return space


def element_bytes(dtype: str) -> tuple[int, int]:
    """(activation bytes, weight bytes) the kernel stages through shared memory."""
    if dtype == "fp8_w8a8":
        return 1, 1
    if dtype == "bf16":
        return 2, 2
    raise ConfigError(f"unknown dtype {dtype!r}; valid: bf16, fp8_w8a8", key="dtype")


def smem_bytes(config: TileConfig, dtype: str) -> int:
    """Shared memory of the software-pipelined A and B tiles: (BM*BK*a + BK*BN*b) * num_stages."""
    a, b = element_bytes(dtype)
    return (config.BLOCK_SIZE_M * config.BLOCK_SIZE_K * a + config.BLOCK_SIZE_K * config.BLOCK_SIZE_N * b) \
        * config.num_stages


def smem_limit_bytes(sm_version: int) -> int:
    if sm_version not in SMEM_LIMIT_BYTES_BY_SM:
        raise ConfigError(f"no shared-memory limit known for SM {sm_version}; known: "
                          f"{sorted(SMEM_LIMIT_BYTES_BY_SM)}", key="gpu")
    return SMEM_LIMIT_BYTES_BY_SM[sm_version]


def fits_smem(config: TileConfig, dtype: str, limit_bytes: int) -> bool:
    return smem_bytes(config, dtype) <= limit_bytes


def feasible_space(dtype: str, block_shape: tuple[int, int] | None, limit_bytes: int) -> list[TileConfig]:
    """The configs the search samples from: SGLang's space, block-shape rule, shared-memory limit."""
    return [c for c in search_space_for(dtype, block_shape) if fits_smem(c, dtype, limit_bytes)]


def default_config(M: int, E: int, N: int, K: int, topk: int, dtype: str | None,
                   block_shape: tuple[int, int] | None = None) -> TileConfig:
    """SGLang's ``get_default_config`` on CUDA (no deterministic inference, not marlin).

    ``dtype`` is SGLang's config dtype string: None for bf16, or "fp8_w8a8". The bf16 rules set no
    num_warps / num_stages, so Triton's launch defaults (4 warps, 3 stages) apply.
    """
    if dtype == "fp8_w8a8":
        if block_shape is None:
            if M <= E:
                return TileConfig(64, 128, 128, 1, num_warps=4, num_stages=4)
            return TileConfig(128, 256, 128, 32, num_warps=8, num_stages=4)
        return TileConfig(64, block_shape[0], block_shape[1], 32, num_warps=4, num_stages=3)
    if M <= E:
        return TileConfig(16, 32, 64, 1)
    return TileConfig(64, 64, 32, 8)


def neighbours(config, space: set, param_values: dict = PARAM_VALUES, make=None) -> list:
    """Configs in ``space`` that differ from ``config`` in exactly one of ``param_values``.

    ``make`` builds a config from a parameter dict (default: TileConfig of the six fused-MoE parameters).
    """
    make = make or (lambda p: TileConfig(**p))
    base = {k: getattr(config, k) for k in param_values}
    out = []
    for name, values in param_values.items():
        for v in values:
            if v == base[name]:
                continue
            cand = make({**base, name: v})
            if cand in space:
                out.append(cand)
    return out


# ---- the down-projection GEMM's own config (SGLang reads it from the ``_down`` file) ---------------

@dataclass(frozen=True, order=True)
class DownTileConfig:
    """A ``_down`` file entry: the tile of the second GEMM, optionally through TMA.

    BLOCK_SIZE_M is not free: both GEMMs share one ``moe_align_block_size`` sort, so SGLang forces the
    down config's BLOCK_SIZE_M to the up config's. USE_TMA is read (and popped) by SGLang 0.5.17+.
    """

    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int
    num_warps: int = TRITON_DEFAULT_NUM_WARPS
    num_stages: int = TRITON_DEFAULT_NUM_STAGES
    USE_TMA: bool = False

    def as_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in PARAM_VALUES}, "USE_TMA": self.USE_TMA}

    @classmethod
    def from_tile(cls, tile: TileConfig, use_tma: bool = False) -> DownTileConfig:
        return cls(**tile.as_dict(), USE_TMA=use_tma)

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "config") -> DownTileConfig:
        return cls.from_tile(TileConfig.from_dict(d, where=where), bool(d.get("USE_TMA", False)))

    @property
    def tile(self) -> TileConfig:
        return TileConfig(**{k: getattr(self, k) for k in PARAM_VALUES})

    def short(self) -> str:
        return self.tile.short() + ("-tma" if self.USE_TMA else "")


#: the down search varies everything but BLOCK_SIZE_M, plus TMA on or off
DOWN_PARAM_VALUES: dict[str, tuple] = {**{k: v for k, v in PARAM_VALUES.items() if k != "BLOCK_SIZE_M"},
                                       "USE_TMA": (False, True)}


def down_space(block_m: int, dtype: str, block_shape: tuple[int, int] | None, limit_bytes: int,
               tma: bool = True) -> list[DownTileConfig]:
    """Down configs at a fixed BLOCK_SIZE_M: SGLang's space (block rule, shared-memory limit) x TMA."""
    tiles = [c for c in feasible_space(dtype, block_shape, limit_bytes) if c.BLOCK_SIZE_M == block_m]
    return [DownTileConfig.from_tile(c, t) for c in tiles for t in ((False, True) if tma else (False,))]


# ---- the fp8 block GEMM (w8a8_block_fp8_matmul) -----------------------------------------------------

#: SGLang's block-wise GEMM tuning space (benchmark/kernels/quantization/tuning_block_wise_kernel.py):
#: stages 2-5, BM 16-256, BK 64/128, BN 32-256, warps 4/8, GROUP_SIZE_M 1-64 = 1,280 configs.
GEMM_PARAM_VALUES: dict[str, tuple[int, ...]] = {**PARAM_VALUES, "BLOCK_SIZE_K": (64, 128)}


def gemm_search_space(block_shape: tuple[int, int] = (128, 128)) -> list[TileConfig]:
    """SGLang's GEMM space; the kernel steps its scales per block_k, so BLOCK_SIZE_K must divide block_k."""
    block_k = block_shape[1]
    return [
        TileConfig(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=g, num_warps=w, num_stages=s)
        for s, bm, bk, bn, w, g in itertools.product(NUM_STAGES, BLOCK_SIZE_M, GEMM_PARAM_VALUES["BLOCK_SIZE_K"],
                                                     BLOCK_SIZE_N, NUM_WARPS, GROUP_SIZE_M)
        if bk <= block_k and block_k % bk == 0
    ]


def gemm_feasible_space(block_shape: tuple[int, int], limit_bytes: int) -> list[TileConfig]:
    return [c for c in gemm_search_space(block_shape) if fits_smem(c, "fp8_w8a8", limit_bytes)]


def gemm_default_config(block_shape: tuple[int, int] = (128, 128)) -> TileConfig:
    """``w8a8_block_fp8_matmul_triton``'s config when no file is found."""
    return TileConfig(64, block_shape[0], block_shape[1], 32, num_warps=4, num_stages=3)
