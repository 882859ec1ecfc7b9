"""Whole forward steps measured on a GPU, and the configuration they ran: the direct measurement
of the step-time model's forward, which the calibration fit weighs beside the servers' windows.

Whole steps come from SGLang's one-batch benchmark (``python -m sglang.bench_one_batch ...
--result-filename FILE``: JSON lines with ``batch_size``, ``input_len``, ``output_len``,
``prefill_latency`` and ``median_decode_latency``) or from timed server steps (JSON lines
``{"kind": "decode", "batch": B, "context": C, "seconds": S}`` or ``{"kind": "prefill", "batch": B,
"new_tokens": N, "prefix": P, "seconds": S}``).

A set file (YAML) names the rows and what ran them, so a fit can build the step-time model of each::

    sets:
      - rows: whole-steps-fp8.jsonl          # relative to this file
        model: qwen3-30b-a3b
        gpu: h200
        sglang_version: 0.5.17
        flags: {tp-size: 1, quantization: fp8, attention-backend: triton}
        fit: [prefill]                       # which kinds a fit uses (default: prefill, decode)

Rows of a kind the fit does not use are still predicted and reported beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.planner import parse_layout, plan_memory
from tuner.planner.memory import prefill_graph_enabled

from .scheduler import version_tuple
from .simulate import build_step_model
from .steptime import RankWork, StepTimeModel


KINDS = ("prefill", "decode")


@dataclass(frozen=True)
class WholeStep:
    kind: str  # prefill | decode
    batch: int
    tokens: int  # prefill: new tokens per request; decode: context per request
    prefix: int
    seconds: float
    source: str


def read_whole_steps(path: str | Path) -> list[WholeStep]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None
    rows = []
    try:
        data = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"line {n}: not JSON: {exc}", file=str(path)) from None
    out: list[WholeStep] = []
    for i, r in enumerate(rows):
        where = f"row {i + 1}"
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: expected an object", file=str(path))
        if "prefill_latency" in r or "median_decode_latency" in r:  # SGLang bench_one_batch
            try:
                bs, inp, outp = int(r["batch_size"]), int(r["input_len"]), int(r.get("output_len", 1))
            except (KeyError, TypeError, ValueError):
                raise ConfigError(f"{where}: bench_one_batch rows need batch_size, input_len, output_len",
                                  file=str(path)) from None
            if r.get("prefill_latency"):
                out.append(WholeStep("prefill", bs, inp, 0, float(r["prefill_latency"]), "bench_one_batch"))
            if r.get("median_decode_latency") and outp > 1:
                out.append(WholeStep("decode", bs, inp + outp // 2, 0, float(r["median_decode_latency"]),
                                     "bench_one_batch"))
            continue
        kind = r.get("kind")
        try:
            if kind == "decode":
                out.append(WholeStep("decode", int(r["batch"]), int(r["context"]), 0, float(r["seconds"]),
                                     "server"))
            elif kind == "prefill":
                out.append(WholeStep("prefill", int(r["batch"]), int(r["new_tokens"]), int(r.get("prefix", 0)),
                                     float(r["seconds"]), "server"))
            else:
                raise ConfigError(f"{where}: kind must be decode or prefill (or give bench_one_batch rows)",
                                  file=str(path))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{where}: {kind} rows need batch, {'context' if kind == 'decode' else 'new_tokens'}"
                              f" and seconds", file=str(path)) from None
    if not out:
        raise ConfigError("no whole steps in the file", file=str(path))
    return out


def step_work(step: WholeStep) -> list[RankWork]:
    """The one rank's work of a whole step (every request the same shape)."""
    if step.kind == "decode":
        return [RankWork(decode_reqs=step.batch, decode_ctx_tokens=step.batch * step.tokens)]
    n, p = step.tokens, step.prefix
    return [RankWork(prefill_tokens=step.batch * n, prefill_seqs=step.batch,
                     prefill_ctx_units=step.batch * n * (p + n / 2), extend_items=[(n, p)] * step.batch)]


@dataclass
class WholeStepSet:
    """Whole steps of one configuration on one GPU."""

    label: str
    model: Any  # ModelDescription
    gpu: Any  # GPUDescription
    flags: dict
    sglang_version: str
    steps: list[WholeStep]
    fit_kinds: tuple[str, ...] = KINDS
    _plan: Any = field(default=None, repr=False)

    @property
    def prefill_graph(self) -> bool:
        """Whether its prefill steps ran as (breakable) CUDA graphs."""
        return prefill_graph_enabled(self.model, self.flags, version_tuple(self.sglang_version))

    @property
    def fitted_steps(self) -> list[WholeStep]:
        """The rows a calibration fit uses (of the kinds in ``fit_kinds``)."""
        return [s for s in self.steps if s.kind in self.fit_kinds]

    def step_model(self, calibration: dict) -> StepTimeModel:
        gpus = int(self.flags.get("tp-size", 1)) * int(self.flags.get("dp-size", 1))
        if self._plan is None:
            plan = plan_memory(self.model, self.gpu, gpus, self.flags, sglang_version=self.sglang_version)
            self._plan = (plan, parse_layout(self.model, self.flags, gpus))
        plan, layout = self._plan
        return build_step_model(self.model, self.gpu, plan, layout, self.flags, {}, calibration, gpus,
                                self.sglang_version)

    def predicted_s(self, calibration: dict, steps: list[WholeStep] | None = None) -> list[float]:
        """Each step's forward as the step-time model has it (``steps``, default all): the GPU time
        with its launch and fixed costs (what the one-batch benchmark times), without the
        scheduler's CPU."""
        sm = self.step_model(calibration)
        return [sm.gpu_time(step_work(s)) for s in (self.steps if steps is None else steps)]


SET_KEYS = ("rows", "model", "gpu", "sglang_version", "flags", "fit")


def read_whole_step_sets(path: str | Path) -> list[WholeStepSet]:
    """The sets of a set file (module docstring), each with its rows read."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not YAML: {exc}", file=str(path)) from None
    sets = doc.get("sets") if isinstance(doc, dict) else None
    if not isinstance(sets, list) or not sets:
        raise ConfigError("expected a non-empty list under `sets`", file=str(path), key="sets")
    out = []
    for i, s in enumerate(sets):
        key = f"sets[{i}]"
        if not isinstance(s, dict):
            raise ConfigError("expected a mapping", file=str(path), key=key)
        unknown = sorted(set(s) - set(SET_KEYS))
        missing = [k for k in ("rows", "model", "gpu") if k not in s]
        if unknown or missing:
            raise ConfigError(f"{'unknown ' + ', '.join(unknown) if unknown else 'missing ' + ', '.join(missing)}; "
                              f"valid keys: {', '.join(SET_KEYS)}", file=str(path), key=key)
        flags = s.get("flags") or {}
        if not isinstance(flags, dict):
            raise ConfigError("expected a mapping of SGLang flags", file=str(path), key=f"{key}.flags")
        try:
            model, gpu = get_model(s["model"]), get_gpu(s["gpu"])
        except ConfigError as exc:
            raise ConfigError(str(exc), file=str(path), key=f"{key}.model/gpu") from None
        kinds = s.get("fit", list(KINDS))
        if not isinstance(kinds, list) or not kinds or any(k not in KINDS for k in kinds):
            raise ConfigError(f"expected a non-empty list of {', '.join(KINDS)}; got {kinds!r}", file=str(path),
                              key=f"{key}.fit")
        rows = path.parent / str(s["rows"])
        out.append(WholeStepSet(label=f"{path.parent.name}/{Path(str(s['rows'])).name}", model=model, gpu=gpu,
                                flags=dict(flags), sglang_version=str(s.get("sglang_version") or "0.5.17"),
                                steps=read_whole_steps(rows), fit_kinds=tuple(kinds)))
    return out
