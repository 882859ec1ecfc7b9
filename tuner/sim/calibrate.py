"""Calibration of the step-time model: load the per-GPU efficiency file and refit its MoE entries
from fused-MoE kernel measurements.

``tuner calibration refit --summary results/kernels/h200/summary.json --gpu h200`` rewrites
``tuner/sim/calibration/h200.yaml`` from a kernel-tuning summary (``write_refit``).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from pathlib import Path
from typing import Any

import yaml

from tuner.catalog import GPUDescription, ModelDescription, gpus
from tuner import safewrite
from tuner.errors import ConfigError
from tuner.kernels.config_groups import tuned_groups
from tuner.planner.memory import prefill_graph_enabled, rules_version
from tuner.planner.startup import default_attention_backend

from .warmup import TUNED_GROUPS_KEY

CALIBRATION_DIR = Path(__file__).parent / "calibration"
# tuned-over-untuned speedup tables, {tokens: speedup}: each replaces the one below it whole
SPEEDUP_TABLES = ("moe_tuned_speedup", "gemm_tuned_speedup")
# per shape, the tuned fused-MoE files' speedup over SGLang's own where a collapsed router sends every
# token to the same few experts (random weights, biased gate: tuner.catalog.routing), from `tuner kernels
# compare --routing collapsed`; tables timed with tokens routed apart do not hold there
COLLAPSED_SPEEDUPS_KEY = "moe_tuned_speedup_collapsed_by_shape"


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in SPEEDUP_TABLES:
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: read on every new configuration


def _read(path: Path) -> dict:
    try:
        with open(path) as f:
            text = f.read()
        try:
            data = yaml.load(text, Loader=_FAST_LOADER) or {}
        except yaml.YAMLError:
            data = yaml.safe_load(text) or {}  # the pure-Python parser's error message
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("root must be a mapping", file=str(path))
    return data


CONTEXT_KEYS = ("sglang_version", "attention_backend", "prefill_cuda_graph")


def calibration_context(model: ModelDescription, gpu: GPUDescription, flags: dict[str, Any],
                        sglang_version: str | None) -> dict[str, Any]:
    """What a ``fitted`` entry of a calibration file may be conditioned on: the SGLang rules
    version, the attention backend, and whether prefill steps run as CUDA graphs."""
    version = rules_version(sglang_version)
    return {"sglang_version": ".".join(map(str, version)),
            "attention_backend": default_attention_backend(model, gpu, flags),
            "prefill_cuda_graph": prefill_graph_enabled(model, flags, version)}


def _matches(when: dict, context: dict) -> bool:
    return all(str(context.get(k)).lower() == str(v).lower() for k, v in when.items())


# What each fitted value depends on, of the conditions an entry is fitted under (CONTEXT_KEYS), by
# the longest dotted prefix of its path; a value not listed depends on all of them. An entry whose
# conditions hold only in part still gives the values that depend on no failing condition: a server
# with prefill CUDA graphs runs the same scheduler, decode graphs, fused-MoE and GEMM kernels and
# attention kernels as one without; it launches its prefill steps differently, and compiles its
# fused-MoE variants while capturing those graphs at start-up rather than on first use.
VALUE_CONDITIONS: dict[str, tuple[str, ...]] = {
    "overhead.cpu_step_s": ("sglang_version",),  # the scheduler's Python, per step and per request
    "overhead.per_request_s": ("sglang_version",),
    "overhead.fp8_block_gemm_s": ("sglang_version",),  # input quantization kernel of a block-fp8 linear
    "overhead.prefill_batch_s": ("sglang_version",),
    "overhead.layer_s": ("sglang_version", "attention_backend"),  # small kernels inside the decode graphs
    "overhead.mla_layer_s": ("sglang_version", "attention_backend"),
    # used only where prefill runs eagerly, so it is kept for such steps of any context
    "overhead.eager_prefill_per_layer_s": ("sglang_version", "attention_backend"),
    "memory_efficiency": ("sglang_version",),
    "kv_memory_efficiency": ("sglang_version", "attention_backend"),
    "compute_efficiency.moe": ("sglang_version",),
    "compute_efficiency.dense": ("sglang_version",),
    "compute_efficiency.decode_attention": ("sglang_version", "attention_backend"),
    "compute_efficiency.extend_attention": ("sglang_version", "attention_backend"),
}


def value_conditions(path: str) -> tuple[str, ...]:
    """The context keys a fitted value at dotted ``path`` depends on (``VALUE_CONDITIONS``)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        hit = VALUE_CONDITIONS.get(".".join(parts[:n]))
        if hit is not None:
            return hit
    return CONTEXT_KEYS


def _values_holding(values: dict[str, Any], failing: set[str], prefix: str = "") -> dict[str, Any]:
    """The part of ``values`` that depends on none of the ``failing`` conditions."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{prefix}{key}"
        if set(value_conditions(path)) & failing:
            if isinstance(value, dict) and path not in VALUE_CONDITIONS:
                part = _values_holding(value, failing, path + ".")  # a listed value may sit below
                if part:
                    out[key] = part
            continue
        out[key] = copy.deepcopy(value)
    return out


def _leaf_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in values.items():
        if isinstance(value, dict) and f"{prefix}{key}" not in VALUE_CONDITIONS:
            out.extend(_leaf_paths(value, f"{prefix}{key}."))
        else:
            out.append(f"{prefix}{key}")
    return out


def _matching_entries(entries, context: dict[str, Any] | None, file: str) -> list[dict[str, Any]]:
    """The well-formed ``fitted`` entries that apply in ``context``: whole where their ``when``
    holds, else the values that depend on none of its failing conditions (``partial``: those
    values' paths), and none where every value depends on one. Partial entries come first, so an
    entry fitted for the context itself wins. A malformed entry or an unknown condition is an
    error whether or not it would apply."""
    if not isinstance(entries, list):
        raise ConfigError("must be a list of {when, values, source}", file=file, key="fitted")
    whole, partial = [], []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("values"), dict):
            raise ConfigError("needs a mapping 'values'", file=file, key=f"fitted[{i}]")
        when = entry.get("when") or {}
        unknown = set(when) - set(CONTEXT_KEYS)
        if unknown:
            raise ConfigError(f"unknown condition {sorted(unknown)}; valid: {', '.join(CONTEXT_KEYS)}",
                              file=file, key=f"fitted[{i}].when")
        if context is None:
            continue
        name = str(entry.get("name") or entry.get("source") or f"fitted[{i}]")
        failing = {k for k, v in when.items() if not _matches({k: v}, context)}
        if not failing:
            whole.append({**entry, "name": name, "partial": None})
            continue
        values = _values_holding(entry["values"], failing)
        if values:
            partial.append({**entry, "name": name, "values": values, "partial": _leaf_paths(values),
                            "failing": sorted(failing)})
    return partial + whole


def _applied_name(entry: dict[str, Any]) -> str:
    if not entry.get("partial"):
        return entry["name"]
    return f"{entry['name']} (in part: the values that do not depend on {', '.join(entry['failing'])})"


def apply_fitted(cal: dict[str, Any], context: dict[str, Any] | None, *, file: str = "") -> dict[str, Any]:
    """Merge every ``fitted`` entry that applies in ``context`` (``_matching_entries``: whole where
    its ``when`` holds, else the values that do not depend on what fails) and record which ones in
    ``fitted_applied``, and the values taken from partly applying ones in ``fitted_partial``; their
    fidelity checks were made in another context and are not carried. Without a context none applies."""
    entries = _matching_entries(cal.pop("fitted", None) or [], context, file)
    applied, checks, rechecks, partial, trials = [], [], [], {}, []
    for entry in entries:
        cal = _merge(cal, entry["values"])
        applied.append(_applied_name(entry))
        trials += [str(t) for t in entry.get("trials") or []]
        if entry.get("partial"):
            partial[entry["name"]] = entry["partial"]
            continue
        if isinstance(entry.get("checked"), dict):
            checks.append(entry["checked"])
        if isinstance(entry.get("rechecked"), dict):
            rechecks.append(entry["rechecked"])
    cal["fitted_applied"] = applied
    cal["fitted_checks"] = checks
    cal["fitted_rechecks"] = rechecks  # later checks of the same values by today's simulator
    cal["fitted_partial"] = partial
    cal["fitted_trials"] = sorted(set(trials))  # the trials (study#N) the applied entries were fitted on
    cal["fitted_on"] = None  # the GPU the applied entries were fitted on, where it is not this one
    cal["fitted_checks_here"] = []  # a transferred entry's checks on this GPU's own load points
    return cal


# Values of a fitted entry that belong to one device's files rather than to its architecture: the
# tile-config groups of SGLang's fused-MoE files for that device name (another device reads other
# files; tuner.sim.warmup.shipped_groups gives its own groups).
DEVICE_SPECIFIC_VALUES = (("fresh_server_stalls", "moe_config_groups"),)


def _architecture_values(values: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(values)
    for *parents, leaf in DEVICE_SPECIFIC_VALUES:
        node = out
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


def same_architecture_gpus(gpu_name: str, directory: Path | None = None) -> list[str]:
    """The other catalog GPUs of ``gpu_name``'s SM architecture that have a calibration file, by name."""
    directory = CALIBRATION_DIR if directory is None else directory
    table = gpus()
    me = table.get(gpu_name.lower())
    if me is None:
        return []
    return [p.stem for p in sorted(directory.glob("*.yaml"))
            if p.stem != me.name and p.stem in table and table[p.stem].sm_version == me.sm_version]


def transfer_fitted(cal: dict[str, Any], gpu_name: str, context: dict[str, Any] | None, *,
                    directory: Path | None = None) -> dict[str, Any]:
    """Where no entry of ``gpu_name``'s own file holds in ``context``, merge the matching entries of
    the first GPU of the same SM architecture that has some (``same_architecture_gpus``). What
    they fit is relative to the GPU's own peaks (efficiencies) or is host and software time
    (scheduler CPU, launch costs, Triton compiles), so it carries over between GPUs of one
    architecture better than the priors; the device's config-file groups do not
    (``DEVICE_SPECIFIC_VALUES``). Recorded in ``fitted_on`` and in each applied name."""
    if context is None or cal.get("fitted_applied"):
        return cal
    directory = CALIBRATION_DIR if directory is None else directory
    for other in same_architecture_gpus(gpu_name, directory):
        path = directory / f"{other}.yaml"
        entries = _matching_entries(_read(path).get("fitted") or [], context, str(path))
        if not entries:
            continue
        sm = gpus()[other].sm_version
        me = gpus()[gpu_name.lower()].name
        for entry in entries:
            cal = _merge(cal, _architecture_values(entry["values"]))
            cal["fitted_applied"].append(f"{_applied_name(entry)} (fitted on {other}, same SM{sm})")
            cal["fitted_trials"] = sorted({*cal.get("fitted_trials", []), *map(str, entry.get("trials") or [])})
            if entry.get("partial"):
                cal["fitted_partial"][entry["name"]] = entry["partial"]
                continue
            if isinstance(entry.get("checked"), dict):
                cal["fitted_checks"].append({**entry["checked"], "gpu": other})
            if isinstance(entry.get("rechecked"), dict):
                cal["fitted_rechecks"].append({**entry["rechecked"], "gpu": other})
            here = (entry.get("rechecked_on") or {}).get(me)
            if isinstance(here, dict):  # checked on this GPU's own load points since
                cal["fitted_checks_here"].append({**here, "gpu": me})
        cal["fitted_on"] = other
        break
    return cal


def with_values(cal: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``cal`` with ``values`` (nested calibration keys) merged over it, leaf by leaf."""
    return _merge(cal, values)


def fit_base(gpu_name: str, context: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The calibration a fit in ``context`` starts from, and the value paths it holds: the priors,
    with the values of the GPU's own ``fitted`` entries for other contexts that hold in this one
    (``_matching_entries``' partial ones, e.g. the scheduler and kernel values of an eager-prefill
    fit where prefill runs as CUDA graphs). A fit moves only what those leave open; an entry for
    the context itself is what the fit replaces, so it is not a base."""
    cal = load_calibration(gpu_name)
    gpu_file = CALIBRATION_DIR / f"{gpu_name}.yaml"
    entries = (_read(gpu_file).get("fitted") or []) if gpu_file.exists() else []
    held: list[str] = []
    for entry in _matching_entries(entries, context, str(gpu_file)):
        if entry.get("partial"):
            cal = _merge(cal, entry["values"])
            held += [path for path in entry["partial"] if path not in held]
    return cal, held


def load_calibration(gpu_name: str, override: dict | str | Path | None = None, *,
                     context: dict[str, Any] | None = None) -> dict[str, Any]:
    """default.yaml, then <gpu>.yaml, then the GPU file's ``fitted`` entries that hold in
    ``context`` (``calibration_context``; where none does, those of a GPU of the same architecture:
    ``transfer_fitted``), then ``override`` (a dict or a YAML file path)."""
    cal = _read(CALIBRATION_DIR / "default.yaml")
    gpu_file = CALIBRATION_DIR / f"{gpu_name}.yaml"
    fitted: list = []
    if gpu_file.exists():
        data = _read(gpu_file)
        fitted = data.pop("fitted", None) or []
        cal = _merge(cal, data)
    cal["fitted"] = fitted
    cal = apply_fitted(cal, context, file=str(gpu_file))
    cal = transfer_fitted(cal, gpu_name, context)
    if override is not None:
        extra = _read(Path(override)) if isinstance(override, (str, Path)) else override
        cal = _merge(cal, extra)
    for key in SPEEDUP_TABLES:
        cal[key] = {int(k): float(v) for k, v in (cal.get(key) or {}).items()}
    return cal


def refit(summary: dict | str | Path, calibration: dict[str, Any], predicted_default_us=None) -> dict[str, Any]:
    """Update the MoE entries of ``calibration`` from a kernel summary.

    ``summary`` maps batch sizes (tokens) to ``{"default_us": ..., "found_us": ...}``, either at the
    top level or under ``"batch_sizes"``. ``moe_tuned_speedup[M] = default_us / found_us``. When
    ``predicted_default_us(M)`` (the model's time for the default tiles at ``compute_efficiency.moe``)
    is given, ``compute_efficiency.moe`` is scaled by the median of predicted / measured so the
    default-tile kernel matches the measurement.
    """
    if not isinstance(summary, dict):
        with open(summary) as f:
            summary = json.load(f)
    rows = _summary_rows(summary)
    out = copy.deepcopy(calibration)
    speedups: dict[int, float] = {}
    ratios = []
    for key, row in rows.items():
        try:
            m = int(key)
        except (TypeError, ValueError):
            continue
        if not isinstance(row, dict) or "default_us" not in row or "found_us" not in row:
            continue
        default_us, found_us = float(row["default_us"]), float(row["found_us"])
        if default_us <= 0 or found_us <= 0:
            continue
        speedups[m] = round(default_us / found_us, 4)
        if predicted_default_us is not None:
            ratios.append(predicted_default_us(m) / default_us)
    if not speedups:
        raise ConfigError("no batch sizes with default_us and found_us", key="summary")
    out["moe_tuned_speedup"] = dict(sorted(speedups.items()))
    if ratios:
        ratios.sort()
        median = ratios[len(ratios) // 2]
        eff = out.setdefault("compute_efficiency", {})
        eff["moe"] = round(min(1.0, max(0.01, eff.get("moe", 0.5) * median)), 4)
    return out


def _summary_rows(summary: dict, model: str | None = None) -> dict:
    """Batch-size rows keyed by batch size, from a flat summary or the kernel benchmark's
    ``{"shapes": [{"model", "batch_sizes": [{"batch_size", ...}]}]}`` (first shape, or ``model``'s)."""
    if "shapes" in summary:
        shapes = summary["shapes"]
        chosen = next((sh for sh in shapes if model and sh.get("model") == model), shapes[0] if shapes else {})
        summary = chosen
    rows = summary.get("batch_sizes", summary)
    if isinstance(rows, list):
        rows = {str(r.get("batch_size")): r for r in rows if isinstance(r, dict)}
    return rows


def tuned_speedup(cal: dict[str, Any], tokens: int, table_key: str = "moe_tuned_speedup",
                  shape_tag: str | None = None) -> float | None:
    """Measured speedup of tuned over default tiles at ``tokens``, log-interpolated; None if unmeasured.
    ``table_key``: the fused MoE's table, or ``gemm_tuned_speedup`` (the block-fp8 linear layers').
    ``shape_tag`` (``MoEShape.tag``): that shape's own table (``<table_key>_by_shape``) where the
    kernels were tuned for it, else the table of all shapes."""
    return interpolated_speedup(tuned_table(cal, table_key, shape_tag), tokens)


def tuned_table(cal: dict[str, Any], table_key: str = "moe_tuned_speedup", shape_tag: str | None = None) -> dict:
    """The speedup table ``tuned_speedup`` interpolates."""
    table = (cal.get(f"{table_key}_by_shape") or {}).get(shape_tag) if shape_tag else None
    return table or cal.get(table_key) or {}


def collapsed_table(cal: dict[str, Any], shape_tag: str | None) -> dict:
    """The fused-MoE speedup table of ``shape_tag`` measured under a collapsed routing ({} if none)."""
    return dict((cal.get(COLLAPSED_SPEEDUPS_KEY) or {}).get(shape_tag) or {}) if shape_tag else {}


def compare_speedups(doc: dict, where: str = "compare") -> tuple[str, str, dict[int, float]]:
    """(routing, shape tag, {batch size: default_us / files_us}) of a ``tuner kernels compare`` result."""
    if not isinstance(doc, dict) or doc.get("kind") != "moe-compare" or not doc.get("tag"):
        raise ConfigError("not a `tuner kernels compare` result (kind moe-compare with a tag)", file=where)
    table = {}
    for row in doc.get("rows") or []:
        d, f = (row.get("default_us"), row.get("files_us")) if isinstance(row, dict) else (None, None)
        if isinstance(d, (int, float)) and isinstance(f, (int, float)) and d > 0 and f > 0:
            table[int(row["batch_size"])] = round(float(d) / float(f), 4)
    if not table:
        raise ConfigError("no batch size with default_us and files_us", file=where)
    return str(doc.get("routing") or ""), str(doc["tag"]), dict(sorted(table.items()))


def interpolated_speedup(table: dict, tokens: int) -> float | None:
    """A speedup table (batch size -> speedup) at ``tokens``: log-interpolated, flat beyond its ends."""
    return SpeedupCurve(table)(tokens)


class SpeedupCurve:
    """``interpolated_speedup`` of one table, its keys converted and sorted once (for callers that
    ask the same table at many batch sizes)."""

    __slots__ = ("table", "keys")

    def __init__(self, table: dict):
        self.table = {int(k): float(v) for k, v in (table or {}).items()}
        self.keys = sorted(self.table)

    def __call__(self, tokens: int) -> float | None:
        table, keys = self.table, self.keys
        if not table:
            return None
        if tokens <= keys[0]:
            return table[keys[0]]
        if tokens >= keys[-1]:
            return table[keys[-1]]
        for lo, hi in zip(keys, keys[1:]):
            if lo <= tokens <= hi:
                w = (math.log(tokens) - math.log(lo)) / (math.log(hi) - math.log(lo))
                return table[lo] + w * (table[hi] - table[lo])
        return None


def speedups_by_shape(summary: dict, kind: str = "moe") -> dict[str, dict[int, float]]:
    """Per tuned shape (``MoEShape.tag``), the tuned tiles' speedup over what SGLang itself runs
    (its shipped file where it has one, else its default config) at each batch size, from a
    ``tuner kernels tune --impl sglang`` summary (``{"reports": [{"kind", "tag", "rows": [...]}]}``)."""
    out: dict[str, dict[int, float]] = {}
    for report in summary.get("reports") or []:
        if not isinstance(report, dict) or report.get("kind") != kind or not report.get("tag"):
            continue
        table = {}
        for row in report.get("rows") or []:
            speedup = row.get("speedup_vs_baseline") if isinstance(row, dict) else None
            if isinstance(speedup, (int, float)) and speedup > 0 and isinstance(row.get("batch_size"), int):
                table[row["batch_size"]] = round(float(speedup), 4)
        if table:
            out[str(report["tag"])] = dict(sorted(table.items()))
    return out


def pooled_speedups(by_shape: dict[str, dict[int, float]]) -> dict[int, float]:
    """One table for shapes no tuning measured: at each batch size, the median over measured shapes
    (each shape's table interpolated there)."""
    sizes = sorted({m for table in by_shape.values() for m in table})
    return {m: round(statistics.median(interpolated_speedup(t, m) for t in by_shape.values()), 4) for m in sizes}


def write_refit(summary: str | Path, gpu: str, compares: tuple[str | Path, ...] = ()) -> tuple[Path, list[int]]:
    """Refit ``calibration/<gpu>.yaml``'s MoE entries from a kernel summary; (file, batch sizes).
    A summary of SGLang's own kernels (``reports``) gives each tuned shape its table
    (``moe_tuned_speedup_by_shape``) and the rest their median, and the tuned files it lists their
    key groups (``warmup.TUNED_GROUPS_KEY``); an older flat summary one table.
    ``compares`` (``tuner kernels compare`` results under ``--routing collapsed``) give the shapes
    they time their collapsed-routing tables (``COLLAPSED_SPEEDUPS_KEY``)."""
    path = safewrite.check_target(CALIBRATION_DIR / f"{gpu}.yaml")  # before reading it: no link, no device
    current = _read(path) if path.exists() else {}
    collapsed: dict[str, dict[int, float]] = {}
    for c in compares:  # all read and checked before anything is written
        try:
            with open(c) as f:
                routing, tag, table = compare_speedups(json.load(f), where=str(c))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read it: {exc}", file=str(c)) from None
        if routing != "collapsed":
            raise ConfigError(f"timed under {routing or 'no'} routing; only a --routing collapsed compare gives a "
                              "table the tune summary does not", file=str(c))
        collapsed[tag] = table
    with open(summary) as f:
        doc = json.load(f)
    by_shape = speedups_by_shape(doc) if isinstance(doc, dict) else {}
    groups = tuned_groups(doc, Path(summary).parent) if isinstance(doc, dict) else {}
    if groups:  # the key groups a tuned server's fresh kernels follow (warmup.groups_for)
        current[TUNED_GROUPS_KEY] = groups
    else:
        current.pop(TUNED_GROUPS_KEY, None)
    if by_shape:
        fitted = {"moe_tuned_speedup": pooled_speedups(by_shape)}
        current["moe_tuned_speedup_by_shape"] = by_shape
    else:
        fitted = refit(doc, load_calibration(gpu))
        current.pop("moe_tuned_speedup_by_shape", None)
    current["moe_tuned_speedup"] = fitted["moe_tuned_speedup"]
    if collapsed:
        current[COLLAPSED_SPEEDUPS_KEY] = {**(current.get(COLLAPSED_SPEEDUPS_KEY) or {}), **collapsed}
    header = []
    if path.exists():  # keep the file's own explanation, note the refit below it
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            if "MoE entries refit from" not in line:
                header.append(line)
    header.append(f"# MoE entries refit from {summary}")
    with safewrite.atomic_open(path) as f:  # whole or not at all: the simulator reads this file
        f.write("\n".join(header) + "\n")
        yaml.safe_dump(current, f, sort_keys=False)
    return path, sorted(fitted["moe_tuned_speedup"])


def write_fitted(gpu: str, *, when: dict[str, Any], values: dict[str, Any], name: str, source: str,
                 checked: dict[str, Any] | None = None, trials: list[str] | None = None,
                 directory: Path = CALIBRATION_DIR) -> Path:
    """Put a fitted entry into ``<gpu>.yaml`` (replacing the entry with the same ``when``),
    keeping the file's header comments and every other key. ``trials``: the trials (study#N) it
    was fitted on, so that a fidelity check can tell the points it never saw."""
    unknown = set(when) - set(CONTEXT_KEYS)
    if unknown:
        raise ConfigError(f"unknown condition {sorted(unknown)}; valid: {', '.join(CONTEXT_KEYS)}", key="when")
    path = safewrite.check_target(Path(directory) / f"{gpu}.yaml")  # before reading it: no link, no device
    current = _read(path) if path.exists() else {}
    entries = [e for e in (current.get("fitted") or []) if (e or {}).get("when") != when]
    entry = {"name": name, "when": dict(when), "source": source, "values": values}
    if trials:
        entry["trials"] = list(trials)
    if checked:
        entry["checked"] = checked  # the fidelity figures of the calibrated simulator on these data
    entries.append(entry)
    current["fitted"] = entries
    _write_keeping_header(path, current)
    return path


def fitted_entries(gpu: str, context: dict[str, Any], *, directory: Path | None = None) -> list[dict[str, Any]]:
    """The ``fitted`` entries of ``<gpu>.yaml`` whose ``when`` holds in ``context`` (file order)."""
    path = Path(directory or CALIBRATION_DIR) / f"{gpu}.yaml"
    entries = (_read(path).get("fitted") or []) if path.exists() else []
    return [e for e in entries if isinstance(e, dict) and _matches(e.get("when") or {}, context)]


def record_recheck(gpu: str, *, when: dict[str, Any], rechecked: dict[str, Any],
                   directory: Path | None = None, on_gpu: str | None = None) -> Path:
    """Store a later fidelity check of ``gpu``'s fitted entry for ``when`` as its ``rechecked``
    record (replacing an earlier one); its values and its fit-time ``checked`` record stay as they
    are. ``on_gpu``: the check was made on another GPU's load points, which run this entry
    transferred (``transfer_fitted``); it goes to ``rechecked_on.<on_gpu>`` instead."""
    path = safewrite.check_target(Path(directory or CALIBRATION_DIR) / f"{gpu}.yaml")
    current = _read(path) if path.exists() else {}
    entry = next((e for e in (current.get("fitted") or []) if (e or {}).get("when") == when), None)
    if entry is None:
        raise ConfigError(f"no fitted entry for {when} (run `tuner calibration fit --write` first)",
                          file=str(path), key="fitted")
    if on_gpu and on_gpu != gpu:
        entry.setdefault("rechecked_on", {})[on_gpu] = rechecked
    else:
        entry["rechecked"] = rechecked
    _write_keeping_header(path, current)
    return path


def _write_keeping_header(path: Path, current: dict[str, Any]) -> None:
    header = []
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line)
    with safewrite.atomic_open(path) as f:  # whole or not at all: the simulator reads this file
        if header:
            f.write("\n".join(header) + "\n")
        yaml.safe_dump(current, f, sort_keys=False)
