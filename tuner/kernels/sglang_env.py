"""The installed SGLang package, found without importing it, and the tile files it ships.

``shipped_moe_configs`` and ``shipped_gemm_configs`` repeat SGLang's own look-up (exact Triton
version directory, then the other ``triton_*`` directories newest-first; for ``_down``, the up file
when no down file exists), so a report can say which file a server would load and time it. Pure CPU.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from tuner.errors import ConfigError
from tuner.kernels.sglang_layout import (MOE_CONFIG_SUBDIR, SGLangLayout, gemm_config_filename, layout_for)


@dataclass(frozen=True)
class InstalledSGLang:
    package_dir: Path  # .../site-packages/sglang
    version: str
    layout: SGLangLayout

    @property
    def moe_config_root(self) -> Path:
        """The directory SGLang uses when SGLANG_MOE_CONFIG_DIR is unset (it holds configs/)."""
        return self.package_dir / Path(MOE_CONFIG_SUBDIR).parent

    @property
    def gemm_config_dir(self) -> Path:
        return self.package_dir / self.layout.gemm_config_subdir


def _package_version(package_dir: Path) -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("sglang")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    try:
        return _source_tree_version(package_dir)
    except FileNotFoundError:
        return None


def sglang_at(package_dir: str | Path) -> InstalledSGLang:
    """An SGLang package directory (installed or an unpacked source tree such as .../sglang)."""
    package_dir = Path(package_dir)
    version = _source_tree_version(package_dir)
    return InstalledSGLang(package_dir, version, layout_for(version, package_dir))


def _source_tree_version(package_dir: Path) -> str:
    vfile = package_dir / "_version.py"
    text = vfile.read_text() if vfile.is_file() else ""
    m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
    if m:
        return m.group(1)
    dist = sorted(package_dir.parent.glob("sglang-*.dist-info"))
    if dist:
        return dist[-1].name.removeprefix("sglang-").removesuffix(".dist-info")
    raise FileNotFoundError(f"cannot tell the SGLang version of {package_dir}")


def installed_sglang() -> InstalledSGLang | None:
    """The sglang package importable here (not imported), or None."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base)
        if (path / Path(MOE_CONFIG_SUBDIR)).is_dir():
            version = _package_version(path)
            if version is None:
                return None
            return InstalledSGLang(path, version, layout_for(version, path))
    return None


# ---- what SGLang would load -------------------------------------------------------------------------

class Found(str, Enum):
    EXACT = "exact"  # the running Triton's directory
    FALLBACK = "fallback"  # another triton_* directory ("Performance might be sub-optimal!")
    UP_REUSED = "up_reused"  # no _down file: the up file serves both GEMMs
    NONE = "none"  # get_default_config


@dataclass
class Lookup:
    found: Found
    path: Path | None = None
    configs: dict[int, dict] = field(default_factory=dict)

    def nearest(self, M: int) -> dict | None:
        if not self.configs:
            return None
        return dict(self.configs[min(self.configs, key=lambda k: abs(k - M))])


def _version_dirs(configs_root: Path) -> list[str]:
    out = []
    for d in configs_root.iterdir() if configs_root.is_dir() else ():
        if d.is_dir() and re.fullmatch(r"triton_\d+(_\d+)*", d.name):
            out.append(d.name)
    return sorted(out, key=lambda n: tuple(int(x) for x in n.removeprefix("triton_").split("_")), reverse=True)


def _read(path: Path) -> dict[int, dict]:
    """One shipped config file: batch-size keys to tile configs (a malformed one is named)."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise ValueError("not a mapping of batch sizes to tile configs")
        return {int(k): v for k, v in data.items()}
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and int("x") are ValueErrors
        raise ConfigError(f"not a fused-MoE config file SGLang could read: {exc}", file=str(path)) from None


def shipped_moe_configs(config_root: Path, file_name: str, triton_version_dir: str) -> Lookup:
    """SGLang's ``get_moe_configs`` search under ``config_root/configs`` for one file name."""
    configs_root = Path(config_root) / "configs"
    exact = configs_root / triton_version_dir / file_name
    if exact.is_file():
        return Lookup(Found.EXACT, exact, _read(exact))
    for vdir in _version_dirs(configs_root):
        if vdir == triton_version_dir:
            continue
        path = configs_root / vdir / file_name
        if path.is_file():
            return Lookup(Found.FALLBACK, path, _read(path))
    return Lookup(Found.NONE)


def shipped_down_configs(config_root: Path, up_name: str, down_name: str, triton_version_dir: str) -> Lookup:
    down = shipped_moe_configs(config_root, down_name, triton_version_dir)
    if down.found is not Found.NONE:
        return down
    up = shipped_moe_configs(config_root, up_name, triton_version_dir)
    if up.found is not Found.NONE:
        return Lookup(Found.UP_REUSED, up.path, up.configs)
    return down


def shipped_gemm_configs(gemm_config_dir: Path, N: int, K: int, device_name: str,
                         block_shape: tuple[int, int] = (128, 128)) -> Lookup:
    path = Path(gemm_config_dir) / gemm_config_filename(N, K, device_name, block_shape)
    if path.is_file():
        return Lookup(Found.EXACT, path, _read(path))
    return Lookup(Found.NONE)
