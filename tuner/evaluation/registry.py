"""Backend kinds by name (tuner.vocabulary.BackendKind), and the choice `--backend auto` makes.

An evaluator's module is imported only when its kind is used: the live evaluators bring the
replay client (aiohttp) and the process machinery, which a simulated study never needs.
"""

from __future__ import annotations

import importlib
import importlib.util

from tuner.backends import gpu as gpu_mod
from tuner.catalog import get_gpu
from tuner.errors import BackendUnavailableError, ConfigError
from tuner.evaluation.base import Evaluator
from tuner.vocabulary import AUTO_BACKEND, BackendKind, Engine, names

_KINDS: dict[str, str] = {
    BackendKind.SIMULATOR: "tuner.evaluation.sim:SimEvaluator",
    BackendKind.SGLANG: "tuner.evaluation.live:SGLangEvaluator",
    BackendKind.TRANSFORMERS: "tuner.evaluation.live:TransformersEvaluator",
    BackendKind.SERVE_SIM: "tuner.evaluation.serve_sim:ServeSimEvaluator",
}
KINDS = names(BackendKind)


def get_evaluator(kind: str) -> Evaluator:
    if kind not in _KINDS:
        raise ConfigError(f"unknown backend {kind!r}; valid: {AUTO_BACKEND}, {', '.join(_KINDS)}", key="backend")
    module, attr = _KINDS[kind].split(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailableError(f"backend {kind!r} is not available: {exc}") from None
    return cls()


def resolve_auto(study) -> tuple[str, str]:
    """(kind, one-line reason) for ``--backend auto``."""
    engine = study.space().engine
    if engine == Engine.TRANSFORMERS:
        return BackendKind.TRANSFORMERS, "the search space targets the transformers engine"
    if importlib.util.find_spec("sglang") is None:
        return BackendKind.SIMULATOR, "SGLang is not installed here"
    present = gpu_mod.detect_gpus()
    want = get_gpu(study.hardware.gpu)
    matching = [g for g in present if want.torch_name.lower() in g.name.lower() or g.name.lower() in want.torch_name.lower()]
    if len(matching) < study.hardware.gpus_per_node:
        return BackendKind.SIMULATOR, (f"the study needs {study.hardware.gpus_per_node}x {want.display_name}; "
                                       f"this machine has {len(matching)}")
    return BackendKind.SGLANG, f"SGLang is installed and {len(matching)}x {want.display_name} are present"
