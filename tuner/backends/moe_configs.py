"""Fused-MoE Triton tile config files: their names, shapes, and a trial's config directory.

SGLang 0.5.23 (``srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``) looks up
``$SGLANG_MOE_CONFIG_DIR/configs/triton_<X_Y_Z>/<name>.json`` with

    name = E={E},N={N},device_name={torch name, spaces -> _}[,dtype=D][,block_shape=[bn, bk]]
           [,per_channel_quant=True][_down].json

falling back to other ``triton_*`` directories newest-first (so the directory named by the
variable **must contain** ``configs/``; ``os.listdir`` raises otherwise). Setting the variable
replaces SGLang's own directory, so a ``tuned`` trial's directory gets SGLang's shipped files
first (when the package is installed here) and the tuned files over them: shapes nobody tuned
keep the shipped tiles instead of falling back to ``get_default_config``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

from tuner.errors import ConfigError
from tuner.kernels.configfile import moe_config_filename, read_configs
from tuner.kernels.shapes import moe_shape

log = logging.getLogger(__name__)

CONFIG_DIR_ENV = "SGLANG_MOE_CONFIG_DIR"
_VERSION_DIR_RE = re.compile(r"^triton_\d+(_\d+)*$")
_NAME_RE = re.compile(
    r"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]+?)"
    r"(?:,dtype=(?P<dtype>[a-z0-9_]+))?(?:,block_shape=\[(?P<bn>\d+), (?P<bk>\d+)\])?"
    r"(?P<pcq>,per_channel_quant=True)?(?P<down>_down)?\.json$"
)

#: weight format (catalog Checkpoint.weight_format) -> (dtype part, block shape) of the Triton path
_TRITON_WEIGHT_DTYPE: dict[str, tuple[str | None, tuple[int, int] | None]] = {
    "bf16": (None, None),
    "fp8_block": ("fp8_w8a8", (128, 128)),
}


@dataclass(frozen=True)
class MoEConfigKey:
    """Identifies one tile config file."""

    E: int
    N: int
    device_name: str  # torch device name with spaces replaced by _
    dtype: str | None = None
    block_shape: tuple[int, int] | None = None
    per_channel_quant: bool = False
    down: bool = False

    @property
    def file_name(self) -> str:
        return config_file_name(self.E, self.N, self.device_name, self.dtype, self.block_shape,
                                self.per_channel_quant, self.down)


def config_file_name(E: int, N: int, device_name: str, dtype: str | None = None,
                     block_shape: Iterable[int] | None = None, per_channel_quant: bool = False,
                     down: bool = False) -> str:
    """SGLang 0.5.23's ``get_config_file_name`` (one implementation, in tuner.kernels.configfile)."""
    return moe_config_filename(E, N, device_name, dtype, tuple(block_shape) if block_shape else None,
                               per_channel_quant, down)


def parse_config_file_name(name: str) -> MoEConfigKey | None:
    m = _NAME_RE.match(name)
    if not m:
        return None
    bs = (int(m["bn"]), int(m["bk"])) if m["bn"] else None
    return MoEConfigKey(int(m["E"]), int(m["N"]), m["device"], m["dtype"], bs, bool(m["pcq"]), bool(m["down"]))


def version_dir(triton_version: str) -> str:
    """``3.5.1`` -> ``triton_3_5_1`` (local suffixes such as ``+git`` dropped)."""
    core = re.match(r"\d+(\.\d+)*", triton_version)
    if not core:
        raise ValueError(f"not a Triton version: {triton_version!r}")
    return "triton_" + core.group(0).replace(".", "_")


def trial_config_keys(model, gpu, weight_format: str, *, tp_size: int, ep_size: int,
                      shared_experts_fusion: bool = True) -> list[MoEConfigKey]:
    """The files a trial's Triton fused-MoE path reads (up and ``_down``); [] if not Triton.

    The (E, N) shape rule lives in ``tuner.kernels.shapes`` (shared with the kernel tuner).
    """
    if weight_format not in _TRITON_WEIGHT_DTYPE:
        return []  # e.g. nvfp4 runs flashinfer/cutlass MoE kernels, not the Triton ones
    dtype, block = _TRITON_WEIGHT_DTYPE[weight_format]
    shape = moe_shape(model.name, tp_size, ep_size, dtype or "bf16", block,
                      disable_shared_experts_fusion=not shared_experts_fusion)
    return [MoEConfigKey(shape.num_experts, shape.intermediate, gpu.device_name, dtype, block, down=d)
            for d in (False, True)]


def installed_sglang_config_root() -> Path | None:
    """SGLang's shipped ``configs/`` directory, located without importing sglang."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        root = Path(base) / "srt/layers/moe/moe_runner/triton_utils/configs"
        if root.is_dir():
            return root
    return None


def installed_triton_version() -> str | None:
    try:
        return version("triton")
    except Exception:
        return None


def _tuned_files(source: Path, default_version_dir: str) -> list[tuple[str, Path]]:
    """(version dir, file) for every tile config under ``source``.

    Accepts flat files (``source/E=....json``: put under ``default_version_dir``),
    ``source/triton_X_Y_Z/*.json`` and ``source/configs/triton_X_Y_Z/*.json``.
    """
    found: list[tuple[str, Path]] = []
    for path in sorted(source.rglob("*.json")):
        if parse_config_file_name(path.name) is None:
            continue
        parent = path.parent.name
        found.append((parent if _VERSION_DIR_RE.match(parent) else default_version_dir, path))
    return found


def prepare_trial_moe_dir(trial_dir: str | Path, tuned_source: str | Path, *,
                          triton_version: str | None = None, include_shipped: bool = True,
                          required: Iterable[MoEConfigKey] = ()) -> tuple[Path, list[str]]:
    """Build ``<trial_dir>/moe/configs/triton_X_Y_Z/*.json``; return (dir for the env var, files).

    ``required`` keys missing from the tuned files are logged (SGLang then uses shipped or default
    tiles for them), so a "tuned" trial that tunes nothing is visible in the log.
    """
    source = Path(tuned_source)
    if not source.is_dir():
        raise ConfigError(f"tuned MoE config directory {str(source)!r} does not exist",
                          key="backend_options.moe_config_dir")
    root = Path(trial_dir) / "moe"
    configs = root / "configs"
    if root.exists():
        shutil.rmtree(root)
    configs.mkdir(parents=True)
    shipped = installed_sglang_config_root() if include_shipped else None
    if shipped is not None:
        for vdir in shipped.iterdir():
            if vdir.is_dir() and _VERSION_DIR_RE.match(vdir.name):
                shutil.copytree(vdir, configs / vdir.name, dirs_exist_ok=True)
    vdefault = version_dir(triton_version or installed_triton_version() or "3.6.0")
    written: list[str] = []
    for vname, path in _tuned_files(source, vdefault):
        read_configs(path)  # refuse a corrupt file here, not inside the server
        dest = configs / vname / path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        written.append(str(dest.relative_to(root)))
    if not written:
        raise ConfigError(f"no MoE tile config files (E=...,N=...,device_name=....json) under {str(source)!r}",
                          key="backend_options.moe_config_dir")
    names = {Path(w).name for w in written}
    missing = [k.file_name for k in required if k.file_name not in names]
    if missing:
        log.warning("tuned MoE configs lack %s; SGLang uses shipped/default tiles for them", missing)
    return root, written


def env_for(moe_dir: Path | None) -> dict[str, str | None]:
    """Environment for the server: the trial dir for ``tuned``; unset (SGLang's own) otherwise."""
    if moe_dir is None:
        return {CONFIG_DIR_ENV: None}
    if not (Path(moe_dir) / "configs").is_dir():
        raise ValueError(f"{moe_dir} has no configs/ subdirectory; SGLang's fallback listdir would fail")
    return {CONFIG_DIR_ENV: str(Path(moe_dir).resolve())}
