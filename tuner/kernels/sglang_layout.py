"""Where each SGLang version looks for its Triton tile-config files, what it names them and what it
logs when it finds them or not. Pure CPU: reads neither torch, triton nor sglang.

Facts, per version (read from the package sources):

* fused MoE (``srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``): the directory is
  ``$SGLANG_MOE_CONFIG_DIR`` or the module's own directory; files sit under
  ``configs/triton_<X_Y_Z>/E=<E>,N=<N>,device_name=<dev>[,dtype=<d>][,block_shape=[bn, bk]][_down].json``
  where ``triton_<X_Y_Z>`` is the running Triton's version; other ``triton_*`` directories are tried
  newest-first with a "Performance might be sub-optimal!" warning. The ``_down`` file (second GEMM) is
  read too; without it the up file is reused for both GEMMs.
* fp8 block GEMM (``get_w8a8_block_fp8_configs``): ``N=<N>,K=<K>,device_name=<dev>,dtype=fp8_w8a8,
  block_shape=[bn, bk].json`` in a ``configs/`` directory beside the kernel module, with no environment
  variable to move it: 0.5.17 keeps the module at ``kernels/ops/quantization/fp8_kernel.py``, 0.5.23 at
  ``kernels/ops/gemm/fp8_kernel.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError

MOE_CONFIG_DIR_ENV = "SGLANG_MOE_CONFIG_DIR"
MOE_CONFIG_MODULE = "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
MOE_CONFIG_SUBDIR = "srt/layers/moe/moe_runner/triton_utils/configs"


@dataclass(frozen=True)
class SGLangLayout:
    """One SGLang version's config-file facts."""

    version: str
    gemm_kernel_module: str  # path of the module defining get_w8a8_block_fp8_configs, inside sglang/
    reads_down_files: bool = True
    gemm_config_env: str | None = None  # no version so far lets an environment variable move them
    # 0.5.23 pops USE_TMA from the up config too; 0.5.17 passes an up config's keys straight to the
    # kernel, so an up file with USE_TMA breaks it. Our up files never carry USE_TMA (valid for both).
    up_config_takes_use_tma: bool = False

    @property
    def gemm_config_subdir(self) -> str:
        return str(Path(self.gemm_kernel_module).parent / "configs")

    @property
    def gemm_kernel_import(self) -> str:
        """Dotted module name of the GEMM kernel module (``sglang.kernels.ops.….fp8_kernel``)."""
        return "sglang." + self.gemm_kernel_module.removesuffix(".py").replace("/", ".")

    @property
    def moe_kernel_import(self) -> str:
        return "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe"


LAYOUTS: dict[str, SGLangLayout] = {
    "0.5.17": SGLangLayout("0.5.17", gemm_kernel_module="kernels/ops/quantization/fp8_kernel.py"),
    "0.5.23": SGLangLayout("0.5.23", gemm_kernel_module="kernels/ops/gemm/fp8_kernel.py",
                           up_config_takes_use_tma=True),
}

# Candidate homes of the GEMM kernel module, newest layout first (for versions not listed above).
_GEMM_MODULE_CANDIDATES = ("kernels/ops/gemm/fp8_kernel.py", "kernels/ops/quantization/fp8_kernel.py",
                           "srt/layers/quantization/fp8_kernel.py")
_GEMM_FN_MARK = "def get_w8a8_block_fp8_configs("


def _version_key(v: str) -> tuple[int, ...]:
    core = re.match(r"\d+(\.\d+)*", v)
    if not core:
        raise ConfigError(f"not an SGLang version: {v!r}", key="sglang_version")
    return tuple(int(x) for x in core.group(0).split("."))


def layout_for(version: str, package_dir: str | Path | None = None) -> SGLangLayout:
    """The layout of ``version``; for an unlisted version the installed ``package_dir`` is searched."""
    key = ".".join(str(x) for x in _version_key(version))
    if key in LAYOUTS:
        return LAYOUTS[key]
    if package_dir is not None:
        for rel in _GEMM_MODULE_CANDIDATES:
            path = Path(package_dir) / rel
            if path.is_file() and _GEMM_FN_MARK in path.read_text(errors="replace"):
                return SGLangLayout(key, gemm_kernel_module=rel)
    raise ConfigError(f"SGLang {version} is not a known layout (known: {', '.join(LAYOUTS)}) and no "
                      f"get_w8a8_block_fp8_configs was found in its package", key="sglang_version")


# ---- file names ------------------------------------------------------------------------------------

def device_file_name(device_name: str) -> str:
    """torch.cuda.get_device_name() as SGLang writes it into file names (spaces -> _)."""
    return device_name.replace(" ", "_")


def gemm_config_filename(N: int, K: int, device_name: str, block_shape: tuple[int, int] = (128, 128)) -> str:
    """``get_w8a8_block_fp8_configs``'s file name (identical in 0.5.17 and 0.5.23)."""
    bn, bk = block_shape
    return f"N={N},K={K},device_name={device_file_name(device_name)},dtype=fp8_w8a8,block_shape=[{bn}, {bk}].json"


_GEMM_NAME_RE = re.compile(r"^N=(?P<N>\d+),K=(?P<K>\d+),device_name=(?P<device>[^,]+),dtype=fp8_w8a8,"
                           r"block_shape=\[(?P<bn>\d+), (?P<bk>\d+)\]\.json$")


def parse_gemm_config_filename(name: str) -> tuple[int, int, str, tuple[int, int]] | None:
    m = _GEMM_NAME_RE.match(name)
    if not m:
        return None
    return int(m["N"]), int(m["K"]), m["device"], (int(m["bn"]), int(m["bk"]))


# ---- what the server logs (0.5.17 and 0.5.23 alike; the golden tests read them from both sources) ----

#: f-string / %-format templates exactly as they appear in the SGLang source.
LOG_TEMPLATES = {
    "moe_found": 'f"Using MoE kernel config from {config_file_path}."',
    "moe_fallback": 'f"Config file not found at {config_file_path}. Fallback to triton version '
                    '{try_triton_version} and use MoE kernel config from {try_config_file_path}. '
                    'Performance might be sub-optimal!"',
    "moe_default": '"Using default MoE kernel config. Performance might be sub-optimal! "',
    "moe_down_reuse": '"Down MoE config file not found at %s; reusing the tuned "',
    "gemm_found": 'f"Using configuration from {config_file_path} for W8A8 Block FP8 kernel."',
    "gemm_default": '"Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "',
}

#: the same messages as they come out in a log line (regular expressions; paths may hold ", ").
LOG_PATTERNS = {
    "moe_found": re.compile(r"Using MoE kernel config from (?P<path>.+?\.json)\.\s*$"),
    "moe_fallback": re.compile(r"Config file not found at (?P<wanted>.+?\.json)\. Fallback to triton version "
                               r"(?P<version>\S+) and use MoE kernel config from (?P<path>.+?\.json)\. "
                               r"Performance might be sub-optimal!"),
    "moe_default": re.compile(r"Using default MoE kernel config\. Performance might be sub-optimal! "
                              r"Config file not found at (?P<wanted>.+?\.json)"),
    "moe_down_reuse": re.compile(r"Down MoE config file not found at (?P<wanted>.+?\.json); reusing the tuned "
                                 r"up-projection config"),
    "gemm_found": re.compile(r"Using configuration from (?P<path>.+?\.json) for W8A8 Block FP8 kernel\."),
    "gemm_default": re.compile(r"Using default W8A8 Block FP8 kernel config\. Performance might be sub-optimal! "
                               r"Config file not found at (?P<wanted>.+?\.json)"),
}
