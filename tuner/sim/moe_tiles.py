"""Efficiency of the fused-MoE GEMM as a function of its tile configuration.

Two losses are modelled from first principles:
* padding: each expert's token rows are padded to a multiple of BLOCK_SIZE_M
  (``moe_align_block_size``), so a GEMM with m rows per expert does ceil(m/BM)*BM rows of work;
* waves: the grid of tiles (experts x row blocks x column blocks) runs in waves over the SMs; a
  partial last wave leaves SMs idle, and a grid smaller than the SM count cannot pull full HBM
  bandwidth.

``default`` is SGLang's ``get_default_config``; ``tuned`` is the best tile of the usual search
grid under the same model (measured kernel speedups, when calibrated, replace it).
"""

from __future__ import annotations

import math
from functools import lru_cache

BM_CHOICES = (16, 32, 64, 128)
BN_CHOICES = (32, 64, 128, 256)


def default_tile(tokens: int, experts: int, fp8_block: bool) -> tuple[int, int]:
    """(BLOCK_SIZE_M, BLOCK_SIZE_N) of SGLang's get_default_config."""
    if fp8_block:
        return 64, 128
    if tokens <= experts:
        return 16, 32
    return 64, 64


def tile_efficiency(rows_per_expert: float, active_experts: float, n: int, bm: int, bn: int,
                    sm_count: int, sm_share: float) -> tuple[float, float]:
    """(compute efficiency, bandwidth efficiency) of one GEMM with this tile."""
    m = max(rows_per_expert, 1e-9)
    row_blocks = math.ceil(m / bm)
    pad = m / (row_blocks * bm)
    tiles = max(1.0, active_experts * row_blocks * math.ceil(n / bn))
    waves = math.ceil(tiles / sm_count)
    wave = tiles / (waves * sm_count)
    bandwidth = min(1.0, sm_share * tiles / sm_count)
    return pad * wave, bandwidth


@lru_cache(maxsize=65536)
def best_tile(rows_bucket: int, active_bucket: int, n: int, sm_count: int, sm_share: float,
              flops_per_byte_balance: float) -> tuple[int, int]:
    """Best (BM, BN) for a GEMM where compute and memory times are balanced by
    ``flops_per_byte_balance`` (time = max(compute/eff_c, memory/eff_b) with the given ratio)."""
    best, best_cost = (64, 64), math.inf
    for bm in BM_CHOICES:
        for bn in BN_CHOICES:
            c, b = tile_efficiency(rows_bucket, active_bucket, n, bm, bn, sm_count, sm_share)
            cost = max(flops_per_byte_balance / max(c, 1e-9), 1.0 / max(b, 1e-9))
            if cost < best_cost:
                best, best_cost = (bm, bn), cost
    return best
