"""Catalog of models and GPUs, read from the YAML data files beside this module.

``get_model("glm-5.1")`` and ``get_gpu("h200")`` return frozen pydantic records; unknown names
raise ConfigError listing the valid ones (with a did-you-mean).
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path

import yaml

from tuner.errors import ConfigError
from tuner.paths import user_path

_DATA = Path(__file__).parent

from tuner.catalog.descriptions import Checkpoint, GPUDescription, ModelDescription, ModuleKind  # noqa: F401
from tuner.catalog.hf import (
    ModelRef, apply_overrides, architecture_of, hf_config_of, model_from_hf_config, read_config_dir,
)


# libyaml's parser where PyYAML has it: the same safe constructor, ~8x faster (the catalog is read
# on a simulation's first call)
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=None)
def _raw(kind: str) -> dict:
    with open(_DATA / f"{kind}.yaml") as f:
        return yaml.load(f, Loader=_SAFE_LOADER)


@lru_cache(maxsize=None)
def models() -> dict[str, ModelDescription]:
    raw = _raw("models")
    out: dict[str, ModelDescription] = {}
    for name, entry in raw.items():
        entry = dict(entry)
        base = entry.pop("same_as", None)
        if base:
            merged = dict(raw[base])
            merged.update(entry)
            entry = merged
        out[name] = ModelDescription(name=name, **entry)
    return out


@lru_cache(maxsize=None)
def gpus() -> dict[str, GPUDescription]:
    return {name: GPUDescription(name=name, **entry) for name, entry in _raw("gpus").items()}


def _suggest(name: str, valid) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; valid: {', '.join(sorted(valid))}"


def get_model(ref) -> ModelDescription:
    """The model a study names: a catalog name, a directory holding a config.json, a
    ``ModelRef`` (name + overrides), or a ``ModelDescription`` (returned as it is)."""
    if isinstance(ref, ModelDescription):
        return ref
    if isinstance(ref, ModelRef):
        return _model_for_ref_json(ref.model_dump_json())
    if isinstance(ref, dict):
        return _model_for_ref_json(ModelRef.model_validate(ref).model_dump_json())
    name = str(ref)
    table = models()
    key = name.lower()
    if key in table:
        return table[key]
    if "/" in name or name.startswith(".") or user_path(name).is_dir():
        path = user_path(name)
        if path.is_dir():
            return model_from_hf_config(read_config_dir(path), name=str(path.resolve()), hf_id=str(path.resolve()))
        if not (path / "config.json").exists() and "/" in name and not name.startswith((".", "/", "~")):
            pass  # an "org/name" hub id: not a catalog name either; fall through to the error
    raise ConfigError(f"unknown model {name!r}{_suggest(key, table)}, and not a directory holding a "
                      f"config.json", key="model")


@lru_cache(maxsize=256)
def _model_for_ref_json(ref_json: str) -> ModelDescription:
    return model_for_ref(ModelRef.model_validate_json(ref_json))


def resolve_ref(ref: ModelRef, *, file: str | None = None, near: Path | None = None) -> ModelRef:
    """``ref`` with ``hf_config`` filled in (the base config with the overrides applied); a
    directory name becomes absolute."""
    base_model = models().get(ref.name.lower())
    if base_model is not None:
        cfg = hf_config_of(base_model)
    else:
        path = user_path(ref.name)
        if not path.is_absolute() and near is not None:
            path = near / path
        cfg = read_config_dir(path, key="model.name", file=file)
        architecture_of(cfg, key="model.name", file=file)
        ref = ref.model_copy(update={"name": str(path.resolve())})
    cfg = apply_overrides(cfg, ref.overrides, file=file)
    return ref.model_copy(update={"hf_config": cfg})


def model_for_ref(ref: ModelRef) -> ModelDescription:
    """The model description of a reference (resolved here if the loader has not)."""
    if ref.hf_config is None:
        ref = resolve_ref(ref)
    base_model = models().get(ref.name.lower())
    if base_model is not None:
        return model_from_hf_config(ref.hf_config, name=base_model.name if not ref.overrides else ref.label,
                                    display_name=base_model.display_name + (" (modified)" if ref.overrides else ""),
                                    checkpoints=base_model.checkpoints, hf_id=base_model.hf_id)
    return model_from_hf_config(ref.hf_config, name=ref.label, hf_id=ref.name)


def model_label(ref) -> str:
    """How a study's model reads in messages and headers."""
    if isinstance(ref, ModelRef):
        return ref.label
    return str(ref)


def get_gpu(name: str) -> GPUDescription:
    table = gpus()
    key = name.lower()
    if key not in table:
        raise ConfigError(f"unknown GPU {name!r}{_suggest(key, table)}", key="hardware.gpu")
    return table[key]
