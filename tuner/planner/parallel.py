"""Parallel layout of a configuration (TP, attention-DP, EP, DP replicas) read from SGLang flags.

Validation follows SGLang 0.5.23's checks: ``tp_size % attn_dp_size == 0``, attention-DP together
with ``dp_size > 1`` is rejected, the EP size divides TP and the number of routed experts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.catalog import ModelDescription
from tuner.errors import ConfigError


def flag_int(flags: dict[str, Any], name: str, default: int) -> int:
    value = flags.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"expected an integer, got {value!r}", key=name)
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"expected an integer, got {value!r}", key=name) from None
    if isinstance(value, float) and not value.is_integer():
        raise ConfigError(f"expected an integer, got {value!r}", key=name)
    return number


def flag_float(flags: dict[str, Any], name: str) -> float | None:
    value = flags.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"expected a number, got {value!r}", key=name) from None


def flag_bool(flags: dict[str, Any], name: str) -> bool:
    value = flags.get(name, False)
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes", "on")
    return bool(value)


@dataclass(frozen=True)
class ParallelLayout:
    tp: int  # GPUs of one model replica
    attn_dp: int  # attention data-parallel ranks inside a replica (one KV pool each)
    ep: int  # expert-parallel ranks
    dp: int  # full model replicas
    a2a_backend: str  # --moe-a2a-backend

    @property
    def attn_tp(self) -> int:
        return self.tp // self.attn_dp

    @property
    def moe_tp(self) -> int:
        return self.tp // self.ep

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def kv_pools(self) -> int:
        return self.attn_dp * self.dp


_A2A_FORCE_EP = {"deepep", "deepep_v2", "megamoe", "mooncake", "nixl", "ascend_fuseep", "flashinfer", "mori"}


def parse_layout(model: ModelDescription, flags: dict[str, Any], gpus_total: int) -> ParallelLayout:
    tp = flag_int(flags, "tp-size", 1)
    dp = flag_int(flags, "dp-size", 1)
    attn_dp = flag_int(flags, "attn-dp-size", 1)
    if flag_bool(flags, "enable-dp-attention") and attn_dp == 1 and dp > 1:
        attn_dp, dp = dp, 1  # deprecated spelling, rewritten by SGLang's parallel hook
    a2a = str(flags.get("moe-a2a-backend") or "none")
    ep = flag_int(flags, "ep-size", 1)
    if a2a in _A2A_FORCE_EP:
        ep = tp
    for name, value in (("tp-size", tp), ("dp-size", dp), ("attn-dp-size", attn_dp), ("ep-size", ep)):
        if value < 1:
            raise ConfigError(f"must be >= 1, got {value}", key=name)
    if tp % attn_dp:
        raise ConfigError(f"tp-size {tp} is not divisible by attn-dp-size {attn_dp}", key="attn-dp-size")
    if attn_dp > 1 and dp > 1:
        raise ConfigError("attn-dp-size > 1 together with dp-size > 1 is rejected by SGLang", key="dp-size")
    if tp % ep:
        raise ConfigError(f"ep-size {ep} does not divide tp-size {tp}", key="ep-size")
    if ep > 1 and (not model.is_moe or model.n_routed_experts % ep):
        raise ConfigError(
            f"ep-size {ep} does not divide the {model.n_routed_experts} routed experts of {model.name}",
            key="ep-size",
        )
    if tp * dp > gpus_total:
        raise ConfigError(
            f"configuration uses tp-size x dp-size = {tp * dp} GPUs but only {gpus_total} are present",
            key="tp-size",
        )
    return ParallelLayout(tp=tp, attn_dp=attn_dp, ep=ep, dp=dp, a2a_backend=a2a)
