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

A tuned file replaces the shipped file of its name, and SGLang takes the entry at the key nearest to
the batch size M: a tuned file with keys 1, 4, 16 only would run every 2048-token prefill chunk with
the M=16 tiles, slower than SGLang's own file for reasons that have nothing to do with tuning. So the
file written is the tuned configs *merged over* what SGLang would have read without it
(``tuner.kernels.sglang_env``'s look-up): tuned entries at the tuned keys, the shipped entries at the
other keys (a file of another Triton version, SGLang's fallback, only where no tuned key covers).
An up file and its ``_down`` twin get one key set (SGLang picks the nearest key in each
file independently; the two GEMMs of a batch must share BLOCK_SIZE_M). With no shipped file of that
name, the batch sizes above the largest tuned key, or that their nearest tuned key does not cover
(``key_covers``), get SGLang's default config, which is what SGLang runs there without our file (a
tune cut short by its time cap would otherwise serve 2048-token chunks with its M=512 tiles, measured
1.33x slower); a file tuned at all of SGLang's batch sizes is copied unchanged.

The fp8 block GEMM's files (``N=…,K=…,device_name=…,dtype=fp8_w8a8,block_shape=[128, 128].json``) have
no environment variable in any SGLang version: ``get_w8a8_block_fp8_configs`` reads the ``configs/``
directory beside its own module (``os.path.realpath(__file__)``). A tuned trial therefore gets a
per-trial *overlay* of the sglang package on ``PYTHONPATH``: real directories down to that module, a
copy of the module file (so ``realpath`` stays in the overlay), a ``configs/`` holding links to the
shipped files plus the tuned files, and symbolic links to everything else of the installed package.
The installed package is never written to, and a default trial is untouched.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

from tuner.errors import ConfigError
from tuner.kernels.configfile import covered_by, moe_config_filename, nearest_config, read_configs, write_configs
from tuner.kernels.gemm_shapes import gemm_shapes
from tuner.kernels.shapes import moe_shape
from tuner.kernels.sglang_env import (Found, Lookup, installed_sglang, sglang_at, shipped_down_configs,
                                      shipped_moe_configs)
from tuner.kernels.sglang_layout import MOE_CONFIG_SUBDIR, gemm_config_filename, parse_gemm_config_filename
from tuner.kernels.space import default_config
from tuner.kernels.targets import SGLANG_BATCH_SIZES

log = logging.getLogger(__name__)

CONFIG_DIR_ENV = "SGLANG_MOE_CONFIG_DIR"
#: where `tuner kernels tune` results live unless backend_options.moe_config_dir says otherwise
DEFAULT_TUNED_MOE_DIR = "results/kernels/{gpu}"


def tuned_source_dir(options, gpu_name: str) -> Path:
    """The tuned tile directory of a study: ``backend_options.moe_config_dir`` or the default."""
    return Path((options or {}).get("moe_config_dir") or DEFAULT_TUNED_MOE_DIR.format(gpu=gpu_name))
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
    shape = moe_shape(model, tp_size, ep_size, dtype or "bf16", block,
                      disable_shared_experts_fusion=not shared_experts_fusion)
    return [MoEConfigKey(shape.num_experts, shape.intermediate, gpu.device_name, dtype, block, down=d)
            for d in (False, True)]


def installed_sglang_config_root() -> Path | None:
    """SGLang's shipped ``configs/`` directory, located without importing sglang."""
    found = installed_sglang()
    return found.package_dir / MOE_CONFIG_SUBDIR if found is not None else None


def installed_triton_version() -> str | None:
    try:
        return version("triton")
    except Exception:
        return None


def _tuned_files(source: Path, default_version_dir: str) -> list[tuple[str, Path]]:
    """(version dir, file) for every tile config under ``source``.

    Accepts flat files (``source/E=....json``: put under ``default_version_dir``),
    ``source/triton_X_Y_Z/*.json`` and ``source/configs/triton_X_Y_Z/*.json`` (what `tuner kernels
    tune -o` writes). Only these places: a tuned directory nested inside another (say
    ``results/kernels/h200/sglang`` inside ``results/kernels/h200``) is not mixed in. The same
    file in two of these places is an error, not a silent choice.
    """
    places: list[tuple[str | None, Path]] = [(None, source)]
    for parent in (source, source / "configs"):
        if parent.is_dir():
            places += [(d.name, d) for d in sorted(parent.iterdir()) if d.is_dir() and _VERSION_DIR_RE.match(d.name)]
    found: dict[tuple[str, str], Path] = {}
    for vname, folder in places:
        for path in sorted(folder.iterdir()):
            if not path.is_file() or parse_config_file_name(path.name) is None:
                continue
            key = (vname or default_version_dir, path.name)
            if key in found:
                raise ConfigError(f"tile config {path.name} is in both {str(found[key].parent)!r} and "
                                  f"{str(path.parent)!r}; keep one", key="backend_options.moe_config_dir")
            found[key] = path
    return [(v, found[(v, n)]) for v, n in sorted(found)]


def _twin_names(name: str) -> tuple[str, str]:
    """(up file name, ``_down`` file name) of the shape ``name`` belongs to."""
    up = name.removesuffix("_down.json") + ".json" if name.endswith("_down.json") else name
    return up, up.removesuffix(".json") + "_down.json"


@dataclass
class _Merged:
    configs: dict[int, dict]  # what the trial's file holds
    filled: list[int]  # keys the tuned file lacked, filled as _merge_over_shipped says
    shipped: Lookup  # where they came from (found NONE: SGLang's default config)


def _merge_over_shipped(shipped_root: Path, vdir: str, up_name: str, tuned_up: dict[int, dict] | None,
                        tuned_down: dict[int, dict] | None) -> dict[str, _Merged]:
    """The tuned up and/or ``_down`` file of one shape merged over SGLang's shipped files (file name ->
    merged); {} when SGLang ships no up file of that name (nothing to merge over, copy unchanged).

    Both files get the keys tuned up | tuned down | shipped up. The up file fills from the shipped up
    (the merged up's nearest entry at a key only the tuned ``_down`` has); the ``_down`` file fills from
    ``shipped_down_configs`` (a shipped ``_down``, else the shipped up reused) with the BLOCK_SIZE_M of
    the up entry at that key, since both GEMMs of a batch run one BLOCK_SIZE_M. Only tuned files are
    written: when only one of the pair is tuned, its twin stays what SGLang reads anyway (the shipped
    file, or the merged up itself when no ``_down`` exists), each filled from its own shipped look-up.
    """
    down_name = _twin_names(up_name)[1]
    ship_up = shipped_moe_configs(shipped_root, up_name, vdir)
    if ship_up.found is Found.NONE:
        # (a shipped _down without its up file is not something SGLang ships)
        return _merge_over_default(up_name, tuned_up, tuned_down)
    ship_down = shipped_down_configs(shipped_root, up_name, down_name, vdir)
    tuned_keys = set(tuned_up or ()) | set(tuned_down or ())
    shipped_up = ship_up.configs
    if ship_up.found is Found.FALLBACK and tuned_keys:
        # another Triton version's file (SGLang itself calls it sub-optimal; our fp8 tunes beat it at
        # every batch size timed): it fills only where no tuned key covers, beyond the tuned range and
        # in gaps between tuned keys (key_covers)
        ordered = sorted(tuned_keys)  # nearest_key breaks ties by order, as SGLang reads its ascending file
        shipped_up = {k: v for k, v in shipped_up.items() if k < ordered[0] or not covered_by(ordered, k)}
    keys = sorted(tuned_keys | set(shipped_up))
    up_entries = dict(sorted({**shipped_up, **(tuned_up or {})}.items()))  # SGLang's up file, merged
    up_at = {k: nearest_config(up_entries, k) for k in keys}
    out: dict[str, _Merged] = {}
    if tuned_up is not None:
        out[up_name] = _Merged(up_at, [k for k in keys if k not in tuned_up], ship_up)
    if tuned_down is not None:
        down = {k: tuned_down[k] if k in tuned_down else
                {**ship_down.nearest(k), "BLOCK_SIZE_M": up_at[k]["BLOCK_SIZE_M"]} for k in keys}
        out[down_name] = _Merged(down, [k for k in keys if k not in tuned_down], ship_down)
    return out


def sglang_default_entries(up_name: str, keys: Iterable[int]) -> dict[int, dict] | None:
    """SGLang's ``get_default_config`` at ``keys`` for the shape of file ``up_name`` (what SGLang runs
    when it finds no file); None for a dtype whose default we do not replicate."""
    key = parse_config_file_name(up_name)
    if key is None or key.dtype not in (None, "fp8_w8a8") or key.per_channel_quant:
        return None
    # the CUDA rules read only M, E, dtype and block shape (K and top-k do not matter there)
    return {M: default_config(M, key.E, key.N, 0, 0, key.dtype, key.block_shape).as_dict() for M in keys}


def _merge_over_default(up_name: str, tuned_up: dict[int, dict] | None,
                        tuned_down: dict[int, dict] | None) -> dict[str, _Merged]:
    """With no shipped file, the batch sizes the tune left uncovered get SGLang's default config.

    Without it SGLang would serve them with the nearest tuned key's tiles. Filled: every one of
    SGLang's tuning batch sizes above the largest tuned key, and each other one whose nearest tuned
    key does not cover it (``key_covers``: more than 1.5x above, or 2.5x below). Above a key its
    tiles are sized for fewer tokens per expert than the batch brings: DeepSeek-V3's fp8 shape ran
    M=1024 and 1280 with its M=512 tiles 1.13x and 1.31x slower than SGLang's default (H200), and a
    tune cut short at M=512 ran M=2048 1.33x slower (``results/kernels/h200/sglang``). Both files of
    the pair get the same keys; a filled ``_down`` entry is the default up config (SGLang runs the
    down GEMM with it when no file is read). {} when nothing is to be filled (the file is copied
    unchanged).
    """
    tuned_keys = sorted(set(tuned_up or ()) | set(tuned_down or ()))
    fill = [M for M in SGLANG_BATCH_SIZES if not covered_by(tuned_keys, M)] if tuned_keys else []
    defaults = sglang_default_entries(up_name, fill) if fill else None
    if not defaults:
        return {}
    down_name = _twin_names(up_name)[1]
    source = Lookup(Found.NONE, None, defaults)
    out: dict[str, _Merged] = {}
    if tuned_up is not None:
        out[up_name] = _Merged(dict(sorted({**defaults, **tuned_up}.items())), fill, source)
    if tuned_down is not None:
        out[down_name] = _Merged(dict(sorted({**defaults, **tuned_down}.items())), fill, source)
    return out


def build_trial_moe_dir(trial_dir: str | Path, tuned_source: str | Path, *, triton_version: str | None = None,
                        include_shipped: bool = True, required: Iterable[MoEConfigKey] = (),
                        shipped_root: Path | None = None, merge_shipped: bool | None = None,
                        ) -> tuple[Path, list[str], dict[str, list[int]]]:
    """``prepare_trial_moe_dir`` plus, per merged file (relative to the dir), the keys filled with
    SGLang's own entries (the shipped file's, else its default config). ``merge_shipped`` (default:
    ``include_shipped``) merges the tuned files over the shipped ones without copying SGLang's other
    files (an export: only the model's shape is read)."""
    merge_shipped = include_shipped if merge_shipped is None else merge_shipped
    source = Path(tuned_source)
    if not source.is_dir():
        raise ConfigError(f"tuned MoE config directory {str(source)!r} does not exist",
                          key="backend_options.moe_config_dir")
    vdefault = version_dir(triton_version or installed_triton_version() or "3.6.0")
    # read every tuned file first: a corrupt one is refused here, before anything is written
    tuned = {(vname, path.name): (path, read_configs(path)) for vname, path in _tuned_files(source, vdefault)}
    if not tuned:
        raise ConfigError(f"no MoE tile config files (E=...,N=...,device_name=....json) under {str(source)!r}",
                          key="backend_options.moe_config_dir")
    if not (include_shipped or merge_shipped):
        shipped_root = None
    elif shipped_root is None:
        installed = installed_sglang_config_root()
        shipped_root = installed.parent if installed is not None else None
    elif not (shipped_root / "configs").is_dir():
        raise ValueError(f"{shipped_root} holds no configs/ directory of shipped MoE tile files")
    root = Path(trial_dir) / "moe"
    configs = root / "configs"
    if root.exists():
        shutil.rmtree(root)
    configs.mkdir(parents=True)
    merged: dict[tuple[str, str], _Merged] = {}
    if shipped_root is not None and include_shipped:
        for vdir in sorted((shipped_root / "configs").iterdir()):
            if vdir.is_dir() and _VERSION_DIR_RE.match(vdir.name):
                shutil.copytree(vdir, configs / vdir.name, dirs_exist_ok=True)
    if shipped_root is not None and merge_shipped:
        for vname, up_name in sorted({(v, _twin_names(n)[0]) for v, n in tuned}):
            up, down = (tuned.get((vname, n), (None, None))[1] for n in _twin_names(up_name))
            for name, m in _merge_over_shipped(shipped_root, vname, up_name, up, down).items():
                merged[(vname, name)] = m
    written: list[str] = []
    filled: dict[str, list[int]] = {}
    for (vname, name), (path, tile_configs) in sorted(tuned.items()):
        dest = configs / vname / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        rel = str(dest.relative_to(root))
        m = merged.get((vname, name))
        if m is not None and m.filled:
            write_configs(dest, m.configs)
            filled[rel] = m.filled
            if m.shipped.found is Found.NONE:
                log.info("%s: %d tuned key(s), %d filled with SGLang's default config (no shipped file): M=%s",
                         rel, len(tile_configs), len(m.filled), m.filled)
            else:
                log.info("%s: %d tuned key(s), %d kept from SGLang's %s (%s)", rel, len(tile_configs),
                         len(m.filled), m.shipped.path, m.shipped.found.value)
        else:
            shutil.copyfile(path, dest)  # nothing shipped to merge over, or the tuned file covers it all
        written.append(rel)
    names = {Path(w).name for w in written}
    missing = [k.file_name for k in required if k.file_name not in names]
    if missing:
        log.warning("tuned MoE configs lack %s; SGLang uses shipped/default tiles for them", missing)
    return root, written, filled


def prepare_trial_moe_dir(trial_dir: str | Path, tuned_source: str | Path, *,
                          triton_version: str | None = None, include_shipped: bool = True,
                          required: Iterable[MoEConfigKey] = (),
                          shipped_root: str | Path | None = None,
                          merge_shipped: bool | None = None) -> tuple[Path, list[str]]:
    """Build ``<trial_dir>/moe/configs/triton_X_Y_Z/*.json``; return (dir for the env var, files).

    With ``include_shipped``, SGLang's shipped files are copied first and each tuned file is merged
    over the shipped one (see the module doc). ``shipped_root`` is the folder holding SGLang's
    ``configs/`` (default: the installed package's; unused without ``include_shipped``).
    ``merge_shipped=True`` with ``include_shipped=False`` merges without copying the other files.
    ``required`` keys missing from the tuned files are logged (SGLang then uses shipped or default
    tiles for them), so a "tuned" trial that tunes nothing is visible in the log.
    """
    root, written, _ = build_trial_moe_dir(trial_dir, tuned_source, triton_version=triton_version,
                                            include_shipped=include_shipped, required=required,
                                            shipped_root=Path(shipped_root) if shipped_root else None,
                                            merge_shipped=merge_shipped)
    return root, written


def env_for(moe_dir: Path | None, gemm_site: Path | None = None,
            inherited_pythonpath: str | None = None) -> dict[str, str | None]:
    """Environment for the server: the trial dir for ``tuned``; unset (SGLang's own) otherwise.

    ``gemm_site`` (from ``prepare_trial_gemm_overlay``) is put first on ``PYTHONPATH``, ahead of
    ``inherited_pythonpath`` (default: this process's ``PYTHONPATH``); apply this mapping after any
    user environment so the overlay is not dropped.
    """
    env: dict[str, str | None] = {}
    if moe_dir is None:
        env[CONFIG_DIR_ENV] = None
    else:
        if not (Path(moe_dir) / "configs").is_dir():
            raise ValueError(f"{moe_dir} has no configs/ subdirectory; SGLang's fallback listdir would fail")
        env[CONFIG_DIR_ENV] = str(Path(moe_dir).resolve())
    if gemm_site is not None:
        if not (Path(gemm_site) / "sglang").is_dir():
            raise ValueError(f"{gemm_site} holds no sglang overlay")
        rest = os.environ.get("PYTHONPATH", "") if inherited_pythonpath is None else inherited_pythonpath
        env["PYTHONPATH"] = os.pathsep.join([str(Path(gemm_site).resolve())] + ([rest] if rest else []))
    return env


def tuned_gemm_files(source: Path) -> list[Path]:
    """The fp8 block GEMM config files of a tuned tile directory (by their SGLang names): flat in
    ``source`` or in ``source/gemm_configs/`` (what `tuner kernels tune -o` writes)."""
    out: dict[str, Path] = {}
    for folder in (source, source / "gemm_configs"):
        for p in sorted(folder.iterdir()) if folder.is_dir() else ():
            if p.is_file() and parse_gemm_config_filename(p.name):
                if p.name in out:
                    raise ConfigError(f"GEMM tile config {p.name} is in both {str(source)!r} and "
                                      f"{str(folder)!r}; keep one", key="backend_options.moe_config_dir")
                out[p.name] = p
    return [out[n] for n in sorted(out)]


def prepare_trial_gemm_overlay(trial_dir: str | Path, tuned_source: str | Path, *,
                               sglang_package: str | Path | None = None) -> tuple[Path | None, list[str]]:
    """Build ``<trial_dir>/sglang-site/sglang`` (see the module doc); return (site dir, files written).

    Returns (None, []) when ``tuned_source`` holds no GEMM files. ``sglang_package`` is the installed
    ``.../sglang`` directory (default: the one importable here).
    """

    source = Path(tuned_source)
    tuned = tuned_gemm_files(source) if source.is_dir() else []
    if not tuned:
        return None, []
    sgl = sglang_at(sglang_package) if sglang_package else installed_sglang()
    if sgl is None:
        raise ConfigError("tuned fp8 GEMM configs need the sglang package installed here, to overlay its "
                          "GEMM config directory", key="backend_options.moe_config_dir")
    for path in tuned:
        read_configs(path)  # refuse a corrupt file before building anything
    site = Path(trial_dir) / "sglang-site"
    if site.exists():
        shutil.rmtree(site)
    real_pkg = sgl.package_dir.resolve()
    module_rel = Path(sgl.layout.gemm_kernel_module)
    chain = [Path(*module_rel.parts[:i]) for i in range(len(module_rel.parts))]  # '', kernels, kernels/ops, ...
    keep_real = {module_rel, module_rel.parent / "configs", *chain[1:]}
    for rel in chain:
        here = site / "sglang" / rel
        here.mkdir(parents=True, exist_ok=True)
        for entry in sorted((real_pkg / rel).iterdir()):
            rel_entry = rel / entry.name
            if rel_entry in keep_real or entry.name == "__pycache__":
                continue
            os.symlink(entry, here / entry.name, target_is_directory=entry.is_dir())
    shutil.copy2(real_pkg / module_rel, site / "sglang" / module_rel)
    configs = site / "sglang" / module_rel.parent / "configs"
    configs.mkdir()
    shipped = real_pkg / module_rel.parent / "configs"
    if shipped.is_dir():
        for entry in sorted(shipped.iterdir()):
            os.symlink(entry, configs / entry.name)
    written = []
    for path in tuned:
        dest = configs / path.name
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        shutil.copyfile(path, dest)
        written.append(str(dest.relative_to(site)))
    return site, written


@dataclass
class TrialTileFiles:
    """What ``prepare_trial_tile_configs`` built for one tuned trial."""

    moe_dir: Path  # the SGLANG_MOE_CONFIG_DIR value
    gemm_site: Path | None  # the PYTHONPATH overlay, if GEMM files were tuned
    moe_files: list[str]  # relative to moe_dir
    gemm_files: list[str]  # relative to gemm_site
    expected: list[str]  # file names the server log must show loaded (see tuner.kernels.logproof)
    #: merged MoE file (relative to moe_dir) -> the keys it lacked, filled with SGLang's own entries
    #: (its shipped file's, or its default config where it ships none)
    filled_from_sglang: dict[str, list[int]] = field(default_factory=dict)

    @property
    def our_dirs(self) -> list[Path]:
        return [self.moe_dir] + ([self.gemm_site] if self.gemm_site else [])

    def env(self, inherited_pythonpath: str | None = None) -> dict[str, str | None]:
        return env_for(self.moe_dir, self.gemm_site, inherited_pythonpath)


def prepare_trial_tile_configs(trial_dir: str | Path, tuned_source: str | Path, *,
                               triton_version: str | None = None, include_shipped: bool = True,
                               required: Iterable[MoEConfigKey] | None = None,
                               required_gemm: Iterable[str] | None = None,
                               sglang_package: str | Path | None = None,
                               shipped_root: str | Path | None = None) -> TrialTileFiles:
    """MoE config dir and (if GEMM files were tuned) the GEMM overlay of one tuned trial.

    ``required`` / ``required_gemm`` (``trial_config_keys`` / ``trial_gemm_file_names``) are the files
    this trial's model reads; those of them that were tuned are what the server log must show loaded.
    None means not known (every tuned file is expected); an empty list means the model reads none
    (a bf16 model reads no fp8 GEMM file, so it gets no GEMM overlay and expects none).
    ``shipped_root``: as in ``prepare_trial_moe_dir``.
    """
    required = None if required is None else list(required)
    required_gemm = None if required_gemm is None else list(required_gemm)
    moe_dir, moe_files, filled = build_trial_moe_dir(
        trial_dir, tuned_source, triton_version=triton_version, include_shipped=include_shipped,
        required=required or (), shipped_root=Path(shipped_root) if shipped_root else None)
    site, gemm_files = None, []
    if required_gemm is None or required_gemm:
        site, gemm_files = prepare_trial_gemm_overlay(trial_dir, tuned_source, sglang_package=sglang_package)
    vdir = version_dir(triton_version or installed_triton_version() or "3.6.0")
    moe_names = [Path(f).name for f in moe_files if Path(f).parent.name == vdir]
    gemm_names = [Path(f).name for f in gemm_files]
    if required is not None:
        wanted = {k.file_name for k in required}
        moe_names = [n for n in moe_names if n in wanted]
    if required_gemm is not None:
        gemm_names = [n for n in gemm_names if n in set(required_gemm)]
    return TrialTileFiles(moe_dir, site, moe_files, gemm_files, moe_names + gemm_names, filled)


def trial_gemm_file_names(model, gpu, weight_format: str, *, tp_size: int, attn_tp_size: int | None = None,
                          shared_experts_fusion: bool = True) -> list[str]:
    """The block-fp8 GEMM config files a trial's linear layers look up; [] unless fp8-block weights."""
    if weight_format != "fp8_block":
        return []

    shapes = gemm_shapes(model, tp_size, attn_tp_size=attn_tp_size,
                         disable_shared_experts_fusion=not shared_experts_fusion)
    return [gemm_config_filename(s.N, s.K, gpu.device_name, s.block_shape) for s in shapes]
