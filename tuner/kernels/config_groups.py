"""Which of an SGLang config file's batch-size keys share one fused-MoE tile config, per device.

A fresh SGLang server compiles Triton's ``fused_moe_kernel`` once per tile config it runs (and per
integer specialisation), so the kernels a server compiles follow its config file: SGLang takes the
entry whose key is nearest to the batch's token count M, and keys with equal configs share one
compiled kernel (``tuner.sim.warmup``). This module reads SGLang's shipped files the way SGLang does
(``tuner.kernels.sglang_env.shipped_moe_configs``: the running Triton's directory first, then the
others newest-first; the ``_down`` file for the second GEMM, else the up file) and groups the keys,
for every shape selector that SGLang ships for a device. Pure CPU: reads JSON files only.

``tuner calibration moe-groups`` writes the result for the catalog's GPUs into the table the
simulator reads (``tuner/sim/calibration/sglang-moe-config-groups.yaml``).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tuner.errors import ConfigError
from tuner.kernels.configfile import device_file_name, nearest_config, read_configs, triton_dir_name
from tuner.kernels.sglang_env import Found, shipped_down_configs, shipped_moe_configs

_DEVICE_PART = re.compile(r",device_name=([^,]+?)(?=,|_down\.json$|\.json$)")


def selector_of(file_name: str) -> tuple[str, str, bool] | None:
    """(shape selector, device file name, is a ``_down`` file) of a config file name, or None for a
    name that is not one: ``E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8.json`` gives
    ``("E=128,N=768,dtype=fp8_w8a8", "NVIDIA_H200", False)``."""
    if not file_name.startswith("E=") or not file_name.endswith(".json"):
        return None
    m = _DEVICE_PART.search(file_name)
    if not m:
        return None
    down = file_name.endswith("_down.json")
    stem = file_name[: -len("_down.json")] if down else file_name[: -len(".json")]
    return stem.replace(m.group(0), "", 1), m.group(1), down


def key_groups(up: dict[int, dict], down: dict[int, dict] | None = None) -> list[list[int]]:
    """The keys of ``up`` (and ``down``) grouped by the (up, down) tile configs SGLang runs at them,
    in ascending order of their smallest key."""
    keys = sorted(set(up) | set(down or {}))
    if not keys:
        return []
    groups: dict[str, list[int]] = {}
    for k in keys:
        pair = (nearest_config(up, k), nearest_config(down, k) if down else None)
        groups.setdefault(json.dumps(pair, sort_keys=True), []).append(k)
    return sorted(groups.values(), key=lambda g: g[0])


def tuned_groups(summary: dict, summary_dir: Path) -> dict[str, list[list[int]]]:
    """Per shape selector, the key groups of the tuned fused-MoE files a ``tuner kernels tune``
    summary lists (each report's ``files``, relative to ``summary_dir``: an up file and its
    ``_down`` file, which SGLang loads instead of its own for ``moe-tile-configs: tuned``)."""
    out: dict[str, list[list[int]]] = {}
    for i, report in enumerate(summary.get("reports") or []):
        if not isinstance(report, dict) or report.get("kind") != "moe":
            continue
        files: dict[bool, tuple[str, Path]] = {}
        for rel in report.get("files") or []:
            parsed = selector_of(Path(str(rel)).name)
            if parsed is not None:
                files[parsed[2]] = (parsed[0], Path(summary_dir) / str(rel))
        if False not in files:
            continue
        tables = {}
        for down, (_selector, path) in files.items():
            try:
                tables[down] = read_configs(path)
            except (OSError, ConfigError) as exc:
                raise ConfigError(f"cannot read a tuned file it lists: {exc}", file=str(path),
                                  key=f"reports[{i}].files") from None
        out[files[False][0]] = key_groups(tables[False], tables.get(True))
    return out


def selectors_for(config_root: Path, device_name: str) -> list[str]:
    """Every shape selector SGLang ships an up file for on ``device_name``, in any Triton directory."""
    configs = Path(config_root) / "configs"
    dev = device_file_name(device_name)
    out = set()
    for path in configs.glob("triton_*/E=*.json"):
        parsed = selector_of(path.name)
        if parsed and parsed[1] == dev and not parsed[2]:
            out.add(parsed[0])
    return sorted(out)


def _file_name(selector: str, device_name: str, down: bool = False) -> str:
    e_n, _, rest = selector.partition(",N=")
    n, sep, tail = rest.partition(",")
    return f"{e_n},N={n},device_name={device_file_name(device_name)}{sep}{tail}{'_down' if down else ''}.json"


def device_groups(config_root: Path, device_name: str, triton_version: str) -> dict[str, dict]:
    """Per shape selector of ``device_name``: the file SGLang loads under ``triton_version`` (relative
    to ``configs/``), whether it is the exact Triton directory, and its key groups."""
    root = Path(config_root)
    if not (root / "configs").is_dir():
        raise ConfigError(f"no configs/ directory under {root} (expected SGLang's "
                          "srt/layers/moe/moe_runner/triton_utils)", key="--sglang-dir")
    vdir = triton_dir_name(triton_version)
    out = {}
    for selector in selectors_for(root, device_name):
        up_name = _file_name(selector, device_name)
        up = shipped_moe_configs(root, up_name, vdir)
        if up.found is Found.NONE:
            continue
        down = shipped_down_configs(root, up_name, _file_name(selector, device_name, down=True), vdir)
        has_down = down.found in (Found.EXACT, Found.FALLBACK)
        out[selector] = {
            "file": str(up.path.relative_to(root / "configs")),
            "down_file": str(down.path.relative_to(root / "configs")) if has_down else None,
            "exact_triton": up.found is Found.EXACT,
            "groups": key_groups(up.configs, down.configs if has_down else None),
        }
    return out


def config_root_of(sglang_dir: Path) -> Path:
    """The directory holding SGLang's fused-MoE ``configs/``, from the package directory
    (``.../sglang``), the directory above it, or that directory itself."""
    base = Path(sglang_dir)
    for cand in (base, base / "srt/layers/moe/moe_runner/triton_utils",
                 base / "sglang/srt/layers/moe/moe_runner/triton_utils"):
        if (cand / "configs").is_dir() and any((cand / "configs").glob("triton_*")):
            return cand
    raise ConfigError(f"{base} holds no SGLang fused-MoE configs (looked for configs/triton_*/ in it, in "
                      "srt/layers/moe/moe_runner/triton_utils/ and in sglang/srt/...); give SGLang's package "
                      "directory", key="--sglang-dir")


# SGLang's block-fp8 linear kernel (``w8a8_block_fp8_matmul_triton``) reads a config file per weight
# shape and device the same way: the entry whose key is nearest to M (17:
# ``kernels/ops/quantization/fp8_kernel.py::get_w8a8_block_fp8_configs``; without a file one default)
_LINEAR_FILE = re.compile(r"^N=(\d+),K=(\d+),device_name=([^,]+),dtype=fp8_w8a8,block_shape=\[(\d+), (\d+)\]\.json$")
LINEAR_CONFIG_DIRS = ("kernels/ops/quantization/configs", "srt/layers/quantization/configs",
                      "sglang/kernels/ops/quantization/configs", "sglang/srt/layers/quantization/configs")


def linear_configs_of(sglang_dir: Path) -> Path | None:
    """The directory of SGLang's block-fp8 linear config files (it moved between releases), or None."""
    base = Path(sglang_dir)
    for rel in LINEAR_CONFIG_DIRS:
        cand = base / rel
        if cand.is_dir() and any(cand.glob("N=*,K=*.json")):
            return cand
    return None


def _linear_files(config_dir: Path, device_name: str) -> list[tuple[str, Path]]:
    """(weight shape ``N=..,K=..``, file) of each block-fp8 linear file (128 x 128 blocks) for ``device_name``."""
    dev = device_file_name(device_name)
    out = []
    for path in sorted(Path(config_dir).glob("N=*,K=*.json")):
        m = _LINEAR_FILE.match(path.name)
        if m and m.group(3) == dev and (m.group(4), m.group(5)) == ("128", "128"):
            out.append((f"N={m.group(1)},K={m.group(2)}", path))
    return out


def _read_linear(path: Path) -> dict[int, dict]:
    try:
        return {int(k): v for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"unreadable block-fp8 config file: {exc}", file=str(path)) from None


def linear_groups(config_dir: Path, device_name: str) -> dict[str, list[list[int]]]:
    """Per block-fp8 linear weight shape ``N=..,K=..`` (128 x 128 blocks) with a file for
    ``device_name``: its batch-size keys grouped by the tile config SGLang runs at them."""
    return {key: key_groups(_read_linear(path)) for key, path in _linear_files(config_dir, device_name)}


# SGLang's block-fp8 linear config where no file covers a weight shape (128 x 128 blocks;
# fp8_kernel.py::w8a8_block_fp8_matmul_triton)
BLOCK_FP8_DEFAULT_CONFIG = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                            "num_warps": 4, "num_stages": 3}


def config_id(config: dict) -> str:
    """A short name for one tile config, equal for equal configs (in any file): Triton builds one
    kernel per config it is launched with, whichever weight shape's file it came from."""
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def linear_config_ids(config_dir: Path, device_name: str) -> dict[str, list[str]]:
    """Per block-fp8 linear weight shape with a file for ``device_name``: the ``config_id`` of each
    of its key groups (``linear_groups``' order)."""
    out = {}
    for key, path in _linear_files(config_dir, device_name):
        configs = _read_linear(path)
        out[key] = [config_id(nearest_config(configs, g[0])) for g in key_groups(configs)]
    return out


def groups_table(config_root: Path, device_names: list[str], triton_version: str) -> dict[str, dict]:
    """``device_groups`` for each device, keyed by its file name (spaces as ``_``)."""
    return {device_file_name(d): device_groups(config_root, d, triton_version) for d in device_names}


__all__ = ["BLOCK_FP8_DEFAULT_CONFIG", "config_id", "config_root_of", "device_groups", "groups_table", "key_groups",
           "linear_config_ids", "linear_configs_of", "linear_groups",
           "selector_of", "selectors_for"]
