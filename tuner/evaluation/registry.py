"""Backend kinds by name, and the choice `--backend auto` makes."""

from __future__ import annotations

import importlib
import importlib.util

from tuner.errors import BackendUnavailableError, ConfigError
from tuner.evaluation.base import Evaluator

_KINDS = {
    "simulator": "tuner.evaluation.sim:SimEvaluator",
    "sglang": "tuner.evaluation.live:SGLangEvaluator",
    "transformers": "tuner.evaluation.live:TransformersEvaluator",
    "serve-sim": "tuner.evaluation.serve_sim:ServeSimEvaluator",
}
KINDS = tuple(_KINDS)


def get_evaluator(kind: str) -> Evaluator:
    if kind not in _KINDS:
        raise ConfigError(f"unknown backend {kind!r}; valid: auto, {', '.join(_KINDS)}", key="backend")
    module, attr = _KINDS[kind].split(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailableError(f"backend {kind!r} is not available: {exc}") from None
    return cls()


def resolve_auto(study) -> tuple[str, str]:
    """(kind, one-line reason) for ``--backend auto``."""
    engine = study.space().engine
    if engine == "transformers":
        return "transformers", "the search space targets the transformers engine"
    if importlib.util.find_spec("sglang") is None:
        return "simulator", "SGLang is not installed here"
    from tuner.backends import gpu as gpu_mod
    from tuner.catalog import get_gpu

    present = gpu_mod.detect_gpus()
    want = get_gpu(study.hardware.gpu)
    matching = [g for g in present if want.torch_name.lower() in g.name.lower() or g.name.lower() in want.torch_name.lower()]
    if len(matching) < study.hardware.gpus_per_node:
        return "simulator", (f"the study needs {study.hardware.gpus_per_node}x {want.display_name}; "
                             f"this machine has {len(matching)}")
    return "sglang", f"SGLang is installed and {len(matching)}x {want.display_name} are present"
