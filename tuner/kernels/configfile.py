"""SGLang's fused-MoE config files: directory and file names, JSON read and write.

Layout: ``<root>/configs/triton_<X_Y_Z>/E=<E>,N=<N>,device_name=<name>[,dtype=<d>][,block_shape=[bn, bk]].json``
with content ``{"<M>": {"BLOCK_SIZE_M": .., "BLOCK_SIZE_N": .., "BLOCK_SIZE_K": .., "GROUP_SIZE_M": ..,
"num_warps": .., "num_stages": ..}}``. SGLang picks the key nearest to the batch's token count.
Importable without torch or triton (the SGLang backend copies these files per trial).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tuner.errors import ConfigError

CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
REQUIRED_KEYS = CONFIG_KEYS[:4]
OPTIONAL_KEYS = ("USE_TMA", "waves_per_eu")


def device_file_name(device_name: str) -> str:
    """torch.cuda.get_device_name() as SGLang puts it in file names (spaces -> _)."""
    return device_name.replace(" ", "_")


def triton_dir_name(version: str) -> str:
    """'3.6.0' -> 'triton_3_6_0'."""
    if not version or not str(version).strip():
        raise ConfigError("triton version is empty", key="triton_version")
    return "triton_" + str(version).strip().replace(".", "_")


def moe_config_filename(E: int, N: int, device_name: str, dtype: str | None = None,
                        block_shape: list[int] | tuple[int, int] | None = None,
                        per_channel_quant: bool = False, down: bool = False) -> str:
    """SGLang's ``get_config_file_name``; dtype None or "bf16" has no dtype part."""
    dtype_part = "" if dtype in (None, "", "bf16", "bfloat16") else f",dtype={dtype}"
    block_part = "" if not block_shape or not all(block_shape) else f",block_shape={list(block_shape)}"
    per_channel_part = ",per_channel_quant=True" if per_channel_quant else ""
    down_part = "_down" if down else ""
    return (f"E={E},N={N},device_name={device_file_name(device_name)}"
            f"{dtype_part}{block_part}{per_channel_part}{down_part}.json")


def config_relpath(E: int, N: int, device_name: str, triton_version: str, dtype: str | None = None,
                   block_shape=None) -> Path:
    """Path relative to the directory SGLANG_MOE_CONFIG_DIR names."""
    return Path("configs") / triton_dir_name(triton_version) / moe_config_filename(E, N, device_name, dtype,
                                                                                  block_shape)


def _validate(data, where: str) -> dict[int, dict[str, int]]:
    if not isinstance(data, dict) or not data:
        raise ConfigError("must be a non-empty JSON object {\"<batch size>\": {tile config}}", file=where)
    out: dict[int, dict[str, int]] = {}
    for key, cfg in data.items():
        try:
            m = int(key)
        except (TypeError, ValueError):
            raise ConfigError(f"key {key!r} is not a batch size (integer)", file=where) from None
        if m <= 0:
            raise ConfigError(f"batch size {m} must be positive", file=where, key=str(key))
        if not isinstance(cfg, dict):
            raise ConfigError("value must be an object of tile parameters", file=where, key=str(key))
        missing = [k for k in REQUIRED_KEYS if k not in cfg]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)}", file=where, key=str(key))
        unknown = sorted(set(cfg) - set(CONFIG_KEYS) - set(OPTIONAL_KEYS))
        if unknown:
            raise ConfigError(f"unknown keys {unknown}; valid: {', '.join(CONFIG_KEYS + OPTIONAL_KEYS)}",
                              file=where, key=str(key))
        values = {}
        for k, v in cfg.items():
            if isinstance(v, bool) and k != "USE_TMA":
                raise ConfigError(f"{k} must be an integer", file=where, key=str(key))
            if not isinstance(v, (int, bool)):
                raise ConfigError(f"{k} must be an integer, got {v!r}", file=where, key=str(key))
            values[k] = v
        out[m] = values
    return out


def ordered_config(cfg: dict) -> dict:
    """Keys in SGLang's order (extra keys after)."""
    return {**{k: int(cfg[k]) for k in CONFIG_KEYS if k in cfg}, **{k: cfg[k] for k in OPTIONAL_KEYS if k in cfg}}


def write_configs(path: str | os.PathLike, configs: dict[int, dict]) -> Path:
    """Write {batch size: config} as SGLang's JSON (keys ascending, indent 4); returns the path."""
    path = Path(path)
    data = _validate({str(k): v for k, v in configs.items()}, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump({str(m): ordered_config(data[m]) for m in sorted(data)}, f, indent=4)
        f.write("\n")
    os.replace(tmp, path)
    return path


def read_configs(path: str | os.PathLike) -> dict[int, dict[str, int]]:
    path = Path(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError("MoE config file not found", file=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"not valid JSON ({exc})", file=str(path)) from None
    return _validate(data, str(path))


#: how far above its key a file entry serves a batch size M well (M / key). Measured on DeepSeek-V3's
#: fp8 shape against SGLang's default (results/kernels/h200/sglang, "Between the keys"): 1.5x above
#: a key ran 0.94-0.98x of the default on the H200 (1.02x on the H100); 2x above the M=512 key 1.13x
#: (H100 1.08x), 2.5x 1.31x (1.14x), 4x 1.33x (1.27-1.30x). 2x above the M=1, 4 and 128 keys still
#: won (0.90-0.95x), but one limit for every M is kept: a full tune's keys (SGLang's list) are
#: never more than 1.5x below the M they serve, so only a file tuned at fewer sizes is affected
MAX_KEY_RATIO_ABOVE = 1.5
#: how far below its key (key / M): between two keys the nearest is less than 2x above M, so this
#: limit acts below the smallest key; 0.75x measured as good as the key itself
MAX_KEY_RATIO_BELOW = 2.5


def key_covers(key: int, M: int, above: float = MAX_KEY_RATIO_ABOVE, below: float = MAX_KEY_RATIO_BELOW) -> bool:
    """Whether the entry at ``key`` serves a batch of M tokens within the measured limits."""
    return key_excess(key, M, above, below) <= 1.0


def key_excess(key: int, M: int, above: float = MAX_KEY_RATIO_ABOVE, below: float = MAX_KEY_RATIO_BELOW) -> float:
    """How far M is from ``key`` as a share of the limit that side (<= 1: covered; inf: no key)."""
    if key <= 0 or M <= 0:
        return float("inf")
    return (M / key) / above if M >= key else (key / M) / below


def covered_by(keys, M: int) -> bool:
    """Whether a file with entries at ``keys`` serves a batch of M tokens from a key that covers it:
    M is not above the largest key, and the key SGLang reads for it is within the limits."""
    keys = list(keys)
    return bool(keys) and M <= max(keys) and key_covers(nearest_key(keys, M), M)


def nearest_key(keys, M: int) -> int:
    """The key SGLang reads for a batch of M tokens: the nearest to M, the first on ties (in a file's
    order, ascending in SGLang's files and ours)."""
    keys = list(keys)
    if not keys:
        raise ConfigError("no configs to choose from")
    return min(keys, key=lambda k: abs(k - M))


def nearest_config(configs: dict[int, dict], M: int) -> dict:
    """The entry SGLang uses for a batch of M tokens: the key nearest to M (first on ties)."""
    return configs[nearest_key(configs, M)]
