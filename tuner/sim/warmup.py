"""Stalls of a freshly started server: what its first traffic costs beyond the step times.

Real SGLang servers (0.5.17, Triton attention and MoE, eager prefill, on the H200) stall a few
times in their first tens of seconds of traffic, for most of a second each, and then rarely:
measured from their own step logs by ``tuner calibration fit`` (``tuner.sim.stepfit.warmup_stalls``),
most likely kernels compiled on their first use by a new batch shape (UNVERIFIED: the log does not
say). The calibration key ``fresh_server_stalls`` holds the measured statistics::

    fresh_server_stalls:
      per_start: 4.1     # stalls per server start (expected, all of them)
      stall_s: 0.86      # mean length of one
      decay_s: 14.0      # their rate decays as exp(-t / decay_s) from the first traffic

The simulator places them deterministically (the same load point always simulates the same) at
the quantiles of that decaying rate, and a stall lands on the first prefill step that starts at
or after its time: the whole server waits (running requests do not decode, the prefill's requests
get their first token later, new arrivals queue). Only a deployment's first load point is
simulated on a fresh server; where its warm-up outlasts the stalls they fall before the window and
change nothing that is measured.

That time schedule is the first model. The step logs of eleven servers say what the stalls are
tied to (``tuner.sim.stepfit.warmup_stalls``): the first prefill batch whose token count needs a
fused-MoE kernel variant the server has not run yet. SGLang picks the fused-MoE tile config by the
batch's token count M, from the config file's entry nearest to M (17:
``layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py::try_get_optimal_moe_config``;
without a file ``get_default_config``), and Triton compiles ``fused_moe_kernel`` once per tile
config and per specialisation of its integer arguments, among them ``num_valid_tokens = M x top-k``
and ``EM``, which Triton specialises on divisibility by 16 (17:
``kernels/ops/moe/fused_moe_triton_kernels.py::fused_moe_kernel``; no ``do_not_specialize``). The
second model, used where the calibration has ``per_new_kernel_s``::

    fresh_server_stalls:
      per_new_kernel_s: 0.64   # mean extra time of a step that runs a new variant
      moe_config_groups:       # config-file keys sharing one tile config, per config file shape
        "E=128,N=768": [[1], [2], [4, 32], ..., [96, 128], ..., [1536, 2048, 3072]]

A variant is (the group of the key nearest M, whether M x top-k is divisible by 16). The groups
follow from the file SGLang loads: keys with equal tile configs. Where the calibration was not
measured on this device's servers, they come from SGLang's own files for the device
(``shipped_groups``, a table ``tuner calibration moe-groups`` writes from SGLang's package; the
H200's groups read from its servers' logs are the same as its files'). Decode steps
replay captured CUDA graphs and do not compile. Triton's on-disk cache outlives a server: where
tuner pins it, a later server of the same kernel set finds built every variant the earlier ones
ran (a second server on a filled cache stalled on none of 35 prompts). tuner records which batch
sizes those were in the cache itself (``tuner.evaluation.kernel_ledger``), and a fresh server is
simulated with their variants built (``CachedKernels``); without a record its cache is cold.

Block-fp8 weights add a second family of per-M kernels: SGLang's Triton linear kernel
(``kernels/ops/quantization/fp8_kernel.py::w8a8_block_fp8_matmul_triton``) picks its tile config per
weight shape from the entry of the device's file nearest to M (one default config without a file)
and takes M as an integer argument, so each (shape, config group, M divisible by 16, M = 1) is a
variant of its own. The batch sizes SGLang's CUDA graphs capture at start-up have run already. A
DeepSeek-V3 server's fused MoE runs one config, yet its first-minute stalls fall where a prefill
reaches a new batch-size bucket (``results/h200-sglang/stall_buckets.py``): its linears' variants.
A prefill step that runs any new variant, of the fused MoE or of a linear, stalls once by
``per_new_kernel_s``; the fit measures it over the windows of both (``stepfit.warmup_stalls``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import yaml

from tuner.errors import ConfigError
from tuner.kernels.config_groups import BLOCK_FP8_DEFAULT_CONFIG, config_id
from tuner.kernels.configfile import device_file_name
from tuner.kernels.shapes import TRITON_MOE_DTYPES, moe_shape
from tuner.kernels.targets import SGLANG_BATCH_SIZES
from tuner.planner.memory import resolve_checkpoint
from tuner.planner.parallel import parse_layout

from .opshapes import gemms

KEY = "fresh_server_stalls"

#: The prompt of the request SGLang's launch sends itself once the server answers
#: (``entrypoints/http_server.py::_execute_server_warmup``, 0.5.17): ``input_ids`` [10, 11, 12] under
#: ``--skip-tokenizer-init``, which tuner passes with dummy weights, and 8 output tokens. Its prefill
#: builds the kernels of M = 3 before (or beside) the first traffic. With a tokenizer it sends the
#: sentence "The capital city of France is" instead (6-7 tokens, by tokenizer), which this does not model.
LAUNCH_WARMUP_PROMPT_TOKENS = 3

#: SGLang 0.5.17 also compiles CUDA kernels of its own with nvcc the first time a process needs them
#: (``sglang/kernels/jit``: ``load_jit`` through tvm-ffi), and keeps the built modules for the whole
#: machine (``~/.cache/tvm-ffi``, or ``TVM_FFI_CACHE_DIR``), outside Triton's cache. On a machine where
#: no server has built them, a DeepSeek (MLA) server's first prefill of ``JIT_FIRST_PREFILL_TOKENS``
#: tokens or more waits ``JIT_MODULE_BUILD_S`` for them: the stall probes' first 1,024-token prompt on
#: a cold machine, less its one Triton GEMM, 7.8 s (call 86) and 10.6 s (call 88); the same prompt on
#: a second server of that machine, 0.5 s; a 513-token prompt before it, no such wait (results/h100-sglang
#: README). Which modules they are is UNVERIFIED, and so is whether a GQA model's first long prefill
#: waits too (not measured: not modelled). SGLang's own warm-up request builds the modules its first
#: prefill needs before ``/health`` answers.
JIT_MODULE_BUILD_S = 9.2
JIT_FIRST_PREFILL_TOKENS = 1024


@dataclass(frozen=True)
class CachedKernels:
    """The per-M kernels a new server finds built in its Triton cache: those of every prefill batch
    size (``prefill_tokens``) and CUDA-graph capture size (``graph_tokens``) that earlier servers of
    the same kernel set ran on that cache (``tuner.evaluation.kernel_ledger``). Triton looks a
    kernel up by its source, constants and specialisations before it compiles, so those variants
    cost the new server nothing; every other variant still builds on first use."""

    prefill_tokens: tuple[int, ...] = ()
    graph_tokens: tuple[int, ...] = ()
    # the machine's JIT-compiled CUDA modules were not built yet (``JIT_MODULE_BUILD_S``): measured
    # empty before the server started; False where they were there or nothing was measured
    jit_cold: bool = False

    def __post_init__(self):
        if not isinstance(self.jit_cold, bool):
            raise ConfigError(f"jit_cold must be true or false, got {self.jit_cold!r}", key="cached_kernels.jit_cold")
        for name in ("prefill_tokens", "graph_tokens"):
            values = getattr(self, name)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
                raise ConfigError(f"{name} must be positive token counts, got {list(values)[:8]}",
                                  key=f"cached_kernels.{name}")
            object.__setattr__(self, name, tuple(sorted(set(values))))

    def __bool__(self) -> bool:
        return bool(self.prefill_tokens or self.graph_tokens or self.jit_cold)

    def to_dict(self) -> dict:
        out = {"prefill_tokens": list(self.prefill_tokens), "graph_tokens": list(self.graph_tokens)}
        return {**out, "jit_cold": True} if self.jit_cold else out

    @classmethod
    def from_dict(cls, doc) -> "CachedKernels":
        if not isinstance(doc, dict):
            raise ConfigError(f"must be a mapping {{prefill_tokens, graph_tokens}}, got {type(doc).__name__}",
                              key="cached_kernels")
        unknown = set(doc) - {"prefill_tokens", "graph_tokens", "jit_cold"}
        if unknown:
            raise ConfigError(f"unknown keys {sorted(unknown)}; valid: prefill_tokens, graph_tokens, jit_cold",
                              key="cached_kernels")
        out = {}
        for name in ("prefill_tokens", "graph_tokens"):
            values = doc.get(name) or []
            if not isinstance(values, list):
                raise ConfigError("must be a list of token counts", key=f"cached_kernels.{name}")
            out[name] = tuple(values)
        return cls(**out, jit_cold=doc.get("jit_cold", False))


@dataclass(frozen=True)
class StallModel:
    per_start: float  # expected stalls per server start
    stall_s: float  # mean length of one stall
    decay_s: float  # time constant of the decaying stall rate, from the first traffic

    @classmethod
    def from_calibration(cls, cal: dict) -> "StallModel | None":
        """The calibration's ``fresh_server_stalls`` (None when absent or zero)."""
        doc = cal.get(KEY)
        if not doc or is_kernel_model(cal):
            return None
        if not isinstance(doc, dict):
            raise ConfigError("must be a mapping {per_start, stall_s, decay_s}", key=KEY)
        try:
            per_start, stall_s, decay_s = (float(doc[k]) for k in ("per_start", "stall_s", "decay_s"))
        except (KeyError, TypeError, ValueError):
            raise ConfigError("needs numbers per_start, stall_s and decay_s", key=KEY) from None
        if per_start < 0 or stall_s < 0 or decay_s <= 0:
            raise ConfigError(f"per_start and stall_s must be >= 0 and decay_s > 0, got {doc}", key=KEY)
        if per_start == 0 or stall_s == 0:
            return None
        return cls(per_start, stall_s, decay_s)

    def expected_after(self, t_s: float) -> float:
        """Expected stalls after ``t_s`` seconds of traffic."""
        return self.per_start * math.exp(-max(0.0, t_s) / self.decay_s)

    def schedule(self) -> list[tuple[float, float]]:
        """(time after the first traffic, length) of each stall: ``round(per_start)`` stalls
        sharing the expected stall time, at the quantiles (i - 1/2) / n of the decaying rate."""
        n = round(self.per_start)
        if n < 1:
            return []
        length = self.per_start * self.stall_s / n
        return [(-self.decay_s * math.log(1.0 - (i + 0.5) / n), length) for i in range(n)]


def stall_schedule(cal: dict, fresh_server: bool) -> list[tuple[float, float]]:
    """The time-scheduled stalls a load point's server goes through: none unless it is fresh (and
    none where the calibration holds the kernel-variant model instead)."""
    if not fresh_server or is_kernel_model(cal):
        return []
    model = StallModel.from_calibration(cal)
    return model.schedule() if model else []


# ---- stalls on a new fused-MoE kernel variant -------------------------------------------------

# the token counts SGLang's fused-MoE config files are tuned at (every file has these keys)
MOE_CONFIG_KEYS: tuple[int, ...] = SGLANG_BATCH_SIZES

# SGLang's shipped fused-MoE config files, grouped per device (``tuner calibration moe-groups``,
# ``tuner.kernels.config_groups``): per SGLang version, device file name and shape selector, the keys
# that share one tile config. A selector the table lists no file for runs SGLang's default config.
SHIPPED_GROUPS_FILE = Path(__file__).parent / "calibration" / "sglang-moe-config-groups.yaml"
#: a fused-MoE variant builds two kernels: the up and the down GEMM (the stall probe's builds)
MOE_KERNELS_PER_VARIANT = 2


@lru_cache(maxsize=1)
def _shipped_table() -> dict:
    if not SHIPPED_GROUPS_FILE.is_file():
        return {}
    try:
        with open(SHIPPED_GROUPS_FILE) as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=str(SHIPPED_GROUPS_FILE)) from None
    if not isinstance(data, dict):
        raise ConfigError("root must be a mapping of SGLang versions", file=str(SHIPPED_GROUPS_FILE))
    return data


def _shipped_section(device_name: str | None, sglang_version: str | None, section: str) -> dict | None:
    """One device's entries of the table's ``section`` (``devices``: fused-MoE selectors;
    ``block_fp8_linear``: linear weight shapes) for SGLang ``sglang_version``; None where the table
    does not cover that version or device."""
    if not device_name or not sglang_version:
        return None
    release = re.match(r"\d+\.\d+\.\d+", str(sglang_version))  # "0.5.17.post1" ships 0.5.17's files
    version = _shipped_table().get(release.group(0) if release else str(sglang_version)) or {}
    return (version.get(section) or {}).get(device_file_name(device_name))


def _checked_groups(groups, where: str, what: str, *, file: Path | None = SHIPPED_GROUPS_FILE,
                    command: str = "tuner calibration moe-groups") -> list[list[int]]:
    if not isinstance(groups, list) or not all(isinstance(g, list) and g and all(isinstance(k, int) for k in g)
                                               for g in groups):
        raise ConfigError(f"needs {what}a list of lists of batch-size keys (rewrite it with `{command}`)",
                          file=str(file) if file else None, key=where)
    return [list(g) for g in groups]


def shipped_groups(device_name: str | None, sglang_version: str | None, key: str) -> list[list[int]] | None:
    """The key groups of the config file SGLang ``sglang_version`` loads for selector ``key`` on
    ``device_name`` (``[]``: it ships none and runs its default config; None: the table does not
    cover that version or device, and every key counts as a config of its own)."""
    device = _shipped_section(device_name, sglang_version, "devices")
    if device is None:
        return None
    entry = device.get(key)
    if entry is None:
        return []
    return _checked_groups(entry.get("groups") if isinstance(entry, dict) else None,
                           f"{sglang_version}.devices.{device_file_name(device_name)}.{key}", "'groups': ")


def triton_moe_shape(model, weight_format: str, tp: int, ep: int, flags: dict | None = None):
    """The expert shape SGLang's Triton fused-MoE kernel runs on one GPU at ``tp`` / ``ep``
    (``tuner.kernels.shapes.moe_shape``, the fused shared expert included); None for a dense model
    or a weight format the Triton kernel does not run."""
    if not getattr(model, "is_moe", False) or weight_format not in TRITON_MOE_DTYPES:
        return None
    dtype, block = TRITON_MOE_DTYPES[weight_format]
    return moe_shape(model, tp, ep, dtype, block,
                     disable_shared_experts_fusion=bool((flags or {}).get("disable-shared-experts-fusion")))


def moe_config_key(shape) -> str:
    """The shape selector of the fused-MoE config file SGLang reads for ``shape``
    (``get_config_file_name`` without the device): ``E=..,N=..[,dtype=..][,block_shape=[..]]``."""
    key = f"E={shape.num_experts},N={shape.intermediate}"
    if shape.config_dtype:
        key += f",dtype={shape.config_dtype}"
    if shape.block_shape:
        key += f",block_shape={list(shape.block_shape)}"
    return key


def is_kernel_model(cal: dict) -> bool:
    doc = cal.get(KEY)
    return isinstance(doc, dict) and "per_new_kernel_s" in doc


def moe_variant(tokens: int, groups: list[list[int]] | None, topk: int,
                default_split_m: int | None = None) -> tuple[int, bool]:
    """The fused-MoE kernel variant a batch of ``tokens`` runs: (tile-config group of the config
    key nearest to it, ties to the smaller key as SGLang's ``min`` does; ``tokens x topk``
    divisible by 16). Without groups every key has a config of its own; with ``[]`` (no file)
    SGLang's ``get_default_config`` runs, one config, or two split at M <= E (``default_split_m``:
    the local experts, where the weights are not block-quantized)."""
    divisible = (tokens * topk) % 16 == 0
    if groups == []:
        return (-1 if default_split_m is None or tokens <= default_split_m else -2), divisible
    return nearest_key_group(tokens, groups), divisible


def nearest_key_group(tokens: int, groups: list[list[int]] | None) -> int:
    """The tile-config group of the config key nearest to ``tokens`` (ties to the smaller key, as
    SGLang's ``min`` over a file's keys); without groups every key is a group of its own."""
    keys = sorted({k for g in groups for k in g}) if groups else MOE_CONFIG_KEYS
    key = min(keys, key=lambda k: abs(k - tokens))
    return next((i for i, g in enumerate(groups or []) if key in g), MOE_CONFIG_KEYS.index(key) + 1000)


def shipped_linear_groups(device_name: str | None, sglang_version: str | None, key: str) -> list[list[int]] | None:
    """The key groups of SGLang's block-fp8 linear config file for weight shape ``key``
    (``N=..,K=..``) on ``device_name`` (``[]``: no file, one default config; None: the table does
    not cover that version or device)."""
    shapes = _shipped_section(device_name, sglang_version, "block_fp8_linear")
    if shapes is None:
        return None
    groups = shapes.get(key)
    if groups is None:
        return []
    return _checked_groups(groups, f"{sglang_version}.block_fp8_linear.{device_file_name(device_name)}.{key}", "")


def shipped_linear_configs(device_name: str | None, sglang_version: str | None, key: str,
                           groups: list[list[int]]) -> tuple[str, ...] | None:
    """The tile config (``config_groups.config_id``) each of ``groups`` of weight shape ``key`` runs
    (one, SGLang's default, where it has no file); None where the table does not say (an older
    table), and the shape's variants are its own."""
    if not groups:
        return (config_id(BLOCK_FP8_DEFAULT_CONFIG),)
    ids = (_shipped_section(device_name, sglang_version, "block_fp8_linear_configs") or {}).get(key)
    if ids is None:
        return None
    if not isinstance(ids, list) or len(ids) != len(groups) or not all(isinstance(i, str) for i in ids):
        raise ConfigError("needs one config id per key group (rewrite it with `tuner calibration moe-groups`)",
                          file=str(SHIPPED_GROUPS_FILE),
                          key=f"{sglang_version}.block_fp8_linear_configs.{device_file_name(device_name)}.{key}")
    return tuple(ids)


@dataclass(frozen=True)
class ServerLinear:
    """One block-fp8 linear weight shape a server runs through SGLang's Triton GEMM."""

    key: str  # N=..,K=..
    groups: list  # its file's key groups ([]: no file, SGLang's default config)
    configs: tuple | None  # the config each group runs (None: unknown, the shape's variants its own)
    runs_in_decode: bool  # False for MLA's kv_b_proj: the absorbed decode runs it as a batched matmul
    scale_stride_div16: bool = field(init=False)  # the scale tensors' row stride K/128 divisible by 16

    def __post_init__(self):
        object.__setattr__(self, "scale_stride_div16", (int(self.key.split("K=")[1]) // 128) % 16 == 0)

    def variant(self, tokens: int) -> tuple:
        """The kernel a batch of ``tokens`` builds for it. SGLang launches ``_w8a8_block_fp8_matmul``
        with the tile config as constexprs and M, N, K and the strides as integers, which Triton
        specialises on divisibility by 16 and on 1: so one kernel per (config, M's specialisation,
        the scale tensors' row stride K/128's), whichever weight shape it serves (measured exactly on
        an H100 server's 35 prompt sizes: results/h100-sglang, stall probe)."""
        group, div16, one = linear_variant(tokens, self.groups)
        if self.configs is None:
            return self.key, (group, div16, one)
        return "fp8_gemm", self.configs[max(group, 0)], div16, one, self.scale_stride_div16


def linear_variant(tokens: int, groups: list[list[int]]) -> tuple[int, bool, bool]:
    """The block-fp8 linear kernel a batch of ``tokens`` runs for one weight shape: (tile-config
    group of the nearest key, ties to the smaller; M divisible by 16; M = 1), Triton's
    specialisations of an integer argument. ``[]``: one default config."""
    return (nearest_key_group(tokens, groups) if groups else -1), tokens % 16 == 0, tokens == 1


def block_fp8_linear_shapes(model, weight_format: str, tp: int, ep: int, flags: dict | None = None) -> list[str]:
    """The weight shapes (``N=..,K=..``) one GPU runs through SGLang's block-fp8 linear kernel: the
    model's non-expert linears in block fp8 (``tuner.sim.opshapes.gemms``), without the shared
    experts where SGLang fuses them into the MoE."""
    return list(_block_fp8_linears(model, weight_format, tp, ep, flags))


def _block_fp8_linears(model, weight_format: str, tp: int, ep: int, flags: dict | None) -> dict[str, bool]:
    """``block_fp8_linear_shapes`` with whether a decode step runs each (MLA's ``kv_b_proj`` runs only
    in a prefill without a cached prefix: the absorbed decode multiplies by its halves directly)."""
    if weight_format != "fp8_block":
        return {}
    flags = dict(flags or {})
    layout = parse_layout(model, {**flags, "tp-size": tp, "ep-size": ep}, tp)
    moe = triton_moe_shape(model, weight_format, tp, ep, flags)
    fused = bool(moe is not None and getattr(moe, "fused_shared_experts", 0))
    out: dict[str, bool] = {}
    for g in gemms(model, resolve_checkpoint(model, flags.get("quantization")), layout):
        if g.dtype != "fp8_block" or g.per != "token" or (fused and g.name.startswith("shared_")):
            continue
        key = f"N={g.n},K={g.k}"
        out[key] = out.get(key, False) or not (getattr(model, "is_mla", False) and g.name == "kv_b_proj")
    return out


def server_linears(model, weight_format: str, tp: int, ep: int, flags: dict | None, device_name: str | None,
                   sglang_version: str | None) -> tuple[ServerLinear, ...]:
    """Each block-fp8 linear one GPU runs, where SGLang's files for the device and version are known
    (``shipped_linear_groups``); () elsewhere."""
    if not device_name or not sglang_version:
        return ()
    out = []
    for key, in_decode in _block_fp8_linears(model, weight_format, tp, ep, flags).items():
        groups = shipped_linear_groups(device_name, sglang_version, key)
        if groups is not None:
            out.append(ServerLinear(key, groups, shipped_linear_configs(device_name, sglang_version, key, groups),
                                    in_decode))
    return tuple(out)


@dataclass
class KernelWarmup:
    """A fresh server's per-M kernel variants (its fused MoE's, ``topk`` > 0, and its block-fp8
    linears'): a prefill step that runs some for the first time waits ``per_new_kernel_s`` for each
    kernel they build (the whole server waits, as for any step)."""

    per_new_kernel_s: float
    groups: list[list[int]] | None
    topk: int  # 0: no Triton fused MoE
    seen: set = None  # variants run so far
    default_split_m: int | None = None  # with groups [] (SGLang's default config): see moe_variant
    linears: tuple = ()  # ServerLinear of each block-fp8 linear
    precompiled_tokens: tuple = ()  # batch sizes its CUDA graphs ran at start-up (their linears compiled)
    prefilled_tokens: tuple = ()  # prefills it ran before any traffic (LAUNCH_WARMUP_PROMPT_TOKENS)
    jit_build_s: float = 0.0  # the machine's JIT modules still to build at its first long prefill

    def __post_init__(self):
        self.seen = set() if self.seen is None else self.seen
        for m in self.precompiled_tokens:
            self.seen.update(lin.variant(m) for lin in self.linears if lin.runs_in_decode)
        for m in self.prefilled_tokens:
            self.seen.update(self._variants(m))

    def new_kernels(self, tokens: int) -> int:
        """How many kernels a batch of ``tokens`` builds (marking its variants run): one per new
        block-fp8 GEMM variant, two per new fused-MoE variant (its up and down GEMMs)."""
        new = [v for v in self._variants(tokens) if v not in self.seen]
        self.seen.update(new)
        return sum(MOE_KERNELS_PER_VARIANT if v[0] == "moe" else 1 for v in new)

    def reaches_new(self, tokens: int) -> bool:
        """Whether a batch of ``tokens`` runs a variant this server has not run (and marks them run)."""
        return self.new_kernels(tokens) > 0

    def _variants(self, tokens: int) -> list:
        out = [lin.variant(tokens) for lin in self.linears]
        if self.topk > 0:
            out.append(("moe", *moe_variant(tokens, self.groups, self.topk, self.default_split_m)))
        return out

    def prefill_stall(self, tokens: int) -> float:
        """The step's wait for the kernels it builds: Triton builds them one after another, each
        ``per_new_kernel_s`` (the stall probe: one GEMM 0.33-0.58 s, two 0.68-1.26 s), and a cold
        machine's first prefill of ``JIT_FIRST_PREFILL_TOKENS`` or more its JIT modules."""
        jit = 0.0
        if self.jit_build_s and tokens >= JIT_FIRST_PREFILL_TOKENS:
            jit, self.jit_build_s = self.jit_build_s, 0.0
        return self.per_new_kernel_s * self.new_kernels(tokens) + jit

    @classmethod
    def from_calibration(cls, cal: dict, shape, device_name: str | None = None,
                         sglang_version: str | None = None, linears: tuple = (),
                         precompiled_tokens: Iterable[int] = (),
                         prefilled_tokens: Iterable[int] = (), jit_build_s: float = 0.0,
                         moe_tiles: str = "default") -> "KernelWarmup | None":
        """The calibration's kernel-variant stalls for a server whose fused MoE runs ``shape``
        (``triton_moe_shape``; None: no Triton fused MoE) and whose block-fp8 linears are
        ``linears`` (``server_linears``); None where neither can stall. The MoE's key groups are the
        calibration's own (read from its servers' logs) where it has them for this shape, else
        those of the file SGLang ships for the device (``shipped_groups``); a server on tuned tiles
        (``moe_tiles``) those of the tuned file (``groups_for``)."""
        doc = cal.get(KEY)
        if not is_kernel_model(cal):
            return None
        try:
            s = float(doc["per_new_kernel_s"])
        except (TypeError, ValueError):
            raise ConfigError("per_new_kernel_s must be a number", key=KEY) from None
        if s < 0:
            raise ConfigError(f"per_new_kernel_s must be >= 0, got {s}", key=KEY)
        if s == 0 or (shape is None and not linears):
            return None
        groups = groups_for(shape, cal, device_name, sglang_version, moe_tiles) if shape is not None else None
        return cls(s, groups, shape.topk if shape is not None else 0,
                   default_split_m=default_split_m(shape, groups) if shape is not None else None,
                   linears=linears, precompiled_tokens=tuple(precompiled_tokens),
                   prefilled_tokens=tuple(prefilled_tokens), jit_build_s=jit_build_s)


def default_split_m(shape, groups: list[list[int]] | None) -> int | None:
    """Where SGLang's default config (no file: ``groups == []``) changes with M: at M <= E, the
    local experts, unless the weights are block-quantized (one config for every M)."""
    return shape.num_experts if groups == [] and not shape.block_shape else None


# the calibration's key groups of the tuned tile files (``tuner calibration refit`` from a
# ``tuner kernels tune`` summary), per config selector: what a ``moe-tile-configs: tuned`` server loads
TUNED_GROUPS_KEY = "moe_tuned_config_groups"


def tuned_groups_of(shape, cal: dict | None) -> list[list[int]] | None:
    """The key groups of the tuned tile file for ``shape`` (``TUNED_GROUPS_KEY``); None where the
    calibration lists none (no tuning covered the shape)."""
    key = moe_config_key(shape)
    tuned = ((cal or {}).get(TUNED_GROUPS_KEY) or {}).get(key)
    return None if tuned is None else _checked_groups(tuned, TUNED_GROUPS_KEY, f"{key!r}: ", file=None,
                                                      command="tuner calibration refit")


def groups_for(shape, cal: dict | None, device_name: str | None, sglang_version: str | None,
               tiles: str = "default") -> list[list[int]] | None:
    """The key groups of ``shape``'s config file: with ``tiles="tuned"`` the tuned file's
    (``TUNED_GROUPS_KEY``) where the calibration lists the shape (a tuned server loads that file
    instead of SGLang's); otherwise, or for a shape no tuning covered, the calibration's
    ``moe_config_groups`` (measured on its servers) where it lists the shape, else the shipped
    file's (``shipped_groups``)."""
    key = moe_config_key(shape)
    tuned = tuned_groups_of(shape, cal) if tiles == "tuned" else None
    if tuned is not None:
        return tuned
    groups = (((cal or {}).get(KEY) or {}).get("moe_config_groups") or {}).get(key)
    if groups is not None and not all(isinstance(g, list) and all(k in MOE_CONFIG_KEYS for k in g)
                                      for g in groups):
        raise ConfigError(f"moe_config_groups[{key!r}] must be lists of config keys {MOE_CONFIG_KEYS}",
                          key=KEY)
    return groups if groups is not None else shipped_groups(device_name, sglang_version, key)


def kernel_warmup(cal: dict, fresh_server: bool, model, weight_format: str, tp: int, ep: int,
                  flags: dict | None = None, device_name: str | None = None,
                  sglang_version: str | None = None, precompiled_tokens: Iterable[int] = (),
                  cached: CachedKernels | None = None, moe_tiles: str = "default") -> KernelWarmup | None:
    """A fresh server's kernel-variant stalls (None for a warm server, the time model, or a model
    with neither a Triton fused MoE nor block-fp8 linears). ``precompiled_tokens``: the batch sizes
    its CUDA graphs captured at start-up (``tuner.planner.memory.captured_token_counts``); SGLang's
    own warm-up request (``LAUNCH_WARMUP_PROMPT_TOKENS``) has run too. ``cached``: what earlier
    servers of the same kernel set left built in its Triton cache (their graphs' kernels count as
    its own graphs' do, their prefills' as its warm-up request's). ``moe_tiles``: the trial's
    ``moe-tile-configs`` (tuned: the tuned files' key groups, ``groups_for``)."""
    if not fresh_server or not is_kernel_model(cal):
        return None
    cached = cached or CachedKernels()
    return KernelWarmup.from_calibration(cal, triton_moe_shape(model, weight_format, tp, ep, flags), device_name,
                                         sglang_version,
                                         server_linears(model, weight_format, tp, ep, flags, device_name, sglang_version),
                                         (*precompiled_tokens, *cached.graph_tokens),
                                         (LAUNCH_WARMUP_PROMPT_TOKENS, *cached.prefill_tokens),
                                         jit_wait_s(model, cached), moe_tiles=moe_tiles)


def jit_wait_s(model, cached: CachedKernels | None) -> float:
    """What a fresh server's first long prefill waits for SGLang's JIT modules: ``JIT_MODULE_BUILD_S``
    where its machine had none built (``CachedKernels.jit_cold``) and the model is MLA (where measured)."""
    cold = cached is not None and cached.jit_cold
    return JIT_MODULE_BUILD_S if cold and getattr(model, "is_mla", False) else 0.0


def fit_decay_s(times_s: list[float], horizon_s: float) -> float:
    """Maximum-likelihood time constant of an exponentially decaying rate from event times seen
    over ``[0, horizon_s]`` (a truncated exponential); ``horizon_s`` when the times do not decay."""
    times = [t for t in times_s if 0 <= t <= horizon_s]
    if not times:
        return horizon_s
    mean = sum(times) / len(times)
    if mean >= horizon_s / 2:  # no decay seen: uniform or rising
        return horizon_s

    def mean_of(tau: float) -> float:  # mean of the exponential truncated at the horizon
        x = horizon_s / tau
        return tau - horizon_s / math.expm1(x) if x < 700 else tau

    lo, hi = 1e-3 * horizon_s, 1e3 * horizon_s
    for _ in range(200):  # the truncated mean rises with tau: bisect on log tau
        mid = math.sqrt(lo * hi)
        if mean_of(mid) < mean:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


__all__ = ["JIT_FIRST_PREFILL_TOKENS", "JIT_MODULE_BUILD_S", "KEY", "CachedKernels", "KernelWarmup",
           "LAUNCH_WARMUP_PROMPT_TOKENS", "MOE_CONFIG_KEYS", "SHIPPED_GROUPS_FILE", "ServerLinear",
           "StallModel", "TUNED_GROUPS_KEY", "block_fp8_linear_shapes", "default_split_m", "fit_decay_s", "groups_for", "is_kernel_model", "tuned_groups_of",
           "jit_wait_s", "kernel_warmup", "linear_variant", "moe_config_key", "moe_variant", "nearest_key_group", "server_linears",
           "shipped_groups", "shipped_linear_configs", "shipped_linear_groups", "stall_schedule", "triton_moe_shape"]
