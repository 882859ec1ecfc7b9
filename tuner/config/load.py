"""YAML files -> validated specs, with errors that name the file, the key path and valid choices."""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from tuner import catalog, safeyaml
from tuner.catalog import ModelRef, resolve_ref
from tuner.errors import ConfigError
from tuner.paths import user_path
from tuner.config import expr, exprcheck
from tuner.config.comparison import ComparisonSpec, check_costs, looks_like_comparison
from tuner.config.knobs import SGLANG_KNOBS
from tuner.config.schema import SearchSpaceSpec, StudySpec
from tuner.workload.profiles import default_search_dirs, load_profile

_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent  # repo root for a source checkout


def search_roots(extra: Path | None = None) -> list[Path]:
    roots = [Path.cwd()]
    if extra is not None:
        roots.insert(0, extra)
    if _PACKAGE_ROOT not in roots:
        roots.append(_PACKAGE_ROOT)
    return roots


def resolve_file(name_or_path: str, folder: str, *, near: Path | None = None, what: str) -> Path:
    """``NAME`` -> ``<root>/<folder>/NAME.yaml``; an existing path is taken as it is."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if p.exists():  # a directory or device is refused with its kind when read
            return p
        if near is not None and (near / p).exists():
            return near / p
        raise ConfigError(f"{what} file {name_or_path!r} does not exist")
    candidates = []
    for root in search_roots(near):
        for ext in (".yaml", ".yml"):
            f = root / folder / f"{name_or_path}{ext}"
            if f.is_file():
                return f
        if (root / folder).is_dir():
            candidates += [c.stem for c in (root / folder).glob("*.y*ml")]
    close = difflib.get_close_matches(name_or_path, sorted(set(candidates)), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    valid = ", ".join(sorted(set(candidates))) or "none found"
    raise ConfigError(f"unknown {what} {name_or_path!r}{hint}; looked in {folder}/ ; valid: {valid}")


def read_yaml(path: Path) -> Any:
    """A YAML mapping from ``path``, read within tuner.safeyaml's limits (size, nesting, aliases,
    duplicate keys)."""
    data = safeyaml.load_file(path)
    if not isinstance(data, dict):
        raise ConfigError(f"the top level must be a mapping of keys, got {type(data).__name__}", file=str(path))
    return data


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """Valid key names at ``loc`` inside ``model`` (for did-you-mean)."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            ann = current.model_fields[part].annotation
            nxt = None
            for cand in getattr(ann, "__args__", ()) or (ann,):
                if isinstance(cand, type) and issubclass(cand, BaseModel):
                    nxt = cand
            current = nxt
        else:
            return []
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def format_validation_error(exc: ValidationError, model: type[BaseModel], file: str, prefix: tuple = ()) -> ConfigError:
    lines = []
    errors = exc.errors()
    # `str | Model` fields: the str branch's complaint about a mapping is noise beside the model's
    errors = [e for e in errors if not (e["type"] == "string_type" and isinstance(e.get("input"), dict))] or errors
    for err in errors:
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "str", "WorkloadProfile", "SearchSpaceSpec"))))
        key = _loc(prefix + loc)
        if err["type"] == "extra_forbidden":
            valid = _fields_at(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            lines.append(f"{key}: unknown key{hint}; valid keys: {', '.join(valid)}")
        elif err["type"] == "missing":
            lines.append(f"{key}: required key is missing")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            shown = repr(err.get("input"))
            shown = shown if len(shown) <= 120 else shown[:117] + "..."
            echoed = "input" in err and not isinstance(err.get("input"), dict) and shown[:40] not in msg
            lines.append(f"{key}: {msg} (got {shown})" if echoed else f"{key}: {msg}")
    first, rest = lines[0], lines[1:]
    more = "".join(f"\n  {line}" for line in rest)
    return ConfigError(first + more, file=file)


def _validate(model: type[BaseModel], data: dict, file: str, prefix: tuple = ()):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc, model, file, prefix) from None


def _did_you_mean(name: str, valid) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_search_space(space: SearchSpaceSpec, file: str, *, prefix: str = "", env_names: set[str] = frozenset()) -> None:
    """Knob names, value types/choices and expression names, for the SGLang engine."""
    params = space.params
    known_vars = {expr.var_name(k) for k in params} | set(env_names)
    for name, p in params.items():
        key = f"{prefix}params.{name}"
        if space.engine == "sglang":
            if name not in SGLANG_KNOBS:
                raise ConfigError(
                    f"unknown knob{_did_you_mean(name, SGLANG_KNOBS)}; valid knobs (SGLang 0.5.23 flag names): "
                    + ", ".join(sorted(SGLANG_KNOBS)), file=file, key=key)
            knob = SGLANG_KNOBS[name]
            for i, v in enumerate(p.grid() if p.values is not None else [p.low, p.high]):
                if v is None:
                    continue
                if knob.type is bool and not isinstance(v, bool):
                    raise ConfigError(f"must be true/false, got {v!r}", file=file, key=f"{key}.values[{i}]")
                if knob.type in (int, float) and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise ConfigError(f"must be a number, got {v!r}", file=file, key=f"{key}.values[{i}]")
                if knob.type is int and not float(v).is_integer():
                    raise ConfigError(f"must be an integer, got {v!r}", file=file, key=f"{key}.values[{i}]")
                if knob.type in (int, float) and v < 0 and name != "chunked-prefill-size":
                    raise ConfigError(f"must be >= 0, got {v!r}", file=file, key=f"{key}.values[{i}]")
                if knob.choices and v not in knob.choices:
                    raise ConfigError(f"invalid value {v!r}{_did_you_mean(str(v), knob.choices)}; valid: "
                                      + ", ".join(map(str, knob.choices)) + " (or null for the default)",
                                      file=file, key=f"{key}.values[{i}]")
            if name == "mem-fraction-static":
                for v in p.grid():
                    if v is not None and not (0 < v < 1):
                        raise ConfigError(f"must be between 0 and 1, got {v}", file=file, key=key)
            if name in ("tp-size", "dp-size", "attn-dp-size", "ep-size"):
                for v in p.grid():
                    if v is not None and v < 1:
                        raise ConfigError(f"must be >= 1, got {v}", file=file, key=key)
        if p.condition:
            unknown = expr.names(p.condition) - known_vars - {"None", "True", "False"}
            if unknown:
                raise ConfigError(f"condition {p.condition!r} names unknown {sorted(unknown)}; known: "
                                  + ", ".join(sorted(known_vars)), file=file, key=f"{key}.condition")
    for i, c in enumerate(space.constraints):
        unknown = expr.names(c) - known_vars
        if unknown:
            raise ConfigError(f"constraint {c!r} names unknown {sorted(unknown)}; known: "
                              + ", ".join(sorted(known_vars)), file=file, key=f"{prefix}constraints[{i}]")
    exprcheck.check_expressions(space, file, prefix=prefix)  # those without the study's GPU counts


def load_search_space(name_or_path: str, *, near: Path | None = None) -> tuple[SearchSpaceSpec, Path]:
    path = resolve_file(name_or_path, "search_spaces", near=near, what="search space")
    data = read_yaml(path)
    space = _validate(SearchSpaceSpec, data, str(path))
    check_search_space(space, str(path), env_names=ENV_NAMES)
    return space, path


ENV_NAMES = {"gpus", "gpus_per_node", "nodes"}


def _resolve_workload(value, file: str, near: Path):
    if not isinstance(value, str):
        return value

    dirs = [r / "workloads" for r in search_roots(near)] + list(default_search_dirs())
    try:
        return load_profile(value, search_dirs=dirs)
    except ConfigError as exc:
        raise ConfigError(exc.detail, file=exc.file or file, key=exc.key or "workload") from None


def load_study(name_or_path: str) -> StudySpec:
    """Load ``studies/NAME.yaml`` (or a path) with its search space and workload resolved and checked."""
    path = resolve_file(name_or_path, "studies", what="study")
    data = read_yaml(path)
    file = str(path)
    study = _validate(StudySpec, data, file)
    root = path.parent.parent if path.parent.name == "studies" else path.parent

    if isinstance(study.search_space, str):
        try:
            space, space_path = load_search_space(study.search_space, near=root)
        except ConfigError as exc:
            raise ConfigError(f"{exc}", file=None if exc.file else file, key=None if exc.file else "search_space") from None
        space_file, space_prefix = str(space_path), ""
    else:
        space = study.search_space
        check_search_space(space, file, prefix="search_space.", env_names=ENV_NAMES)
        space_file, space_prefix = file, "search_space."
    # with this study's GPU counts: the expressions that use gpus / gpus_per_node / nodes
    exprcheck.check_expressions(space, space_file, prefix=space_prefix, env=exprcheck.expression_env(study.hardware))
    workload = _resolve_workload(study.workload, file, root)
    model_ref = study.model
    if space.engine == "sglang":
        model_ref = _resolve_model(study.model, file, root)
        known = _model_or_error(model_ref, file)
        if workload.max_context_tokens > known.max_context_tokens:
            # sessions end before they outgrow the model's context window
            workload = workload.model_copy(update={"max_context_tokens": known.max_context_tokens})
    study = study.model_copy(update={"search_space": space, "workload": workload, "source_path": file,
                                     "model": model_ref})
    check_study(study, file)
    return study


def _resolve_model(model, file: str, root: Path):
    """Catalog names stay names; a model directory or a name with overrides becomes a ``ModelRef``
    carrying its resolved config.json, so trials on other machines need no files."""

    if isinstance(model, str):
        if model.lower() in catalog.models():
            return model
        looks_like_path = "/" in model or model.startswith((".", "~")) or (root / model).is_dir() \
            or user_path(model).is_dir()
        if not looks_like_path:
            return model  # an unknown name: check_study says so, with the valid ones
        model = ModelRef(name=model)
    return resolve_ref(model, file=file, near=root)


def _model_or_error(model, file: str):

    try:
        return catalog.get_model(model)
    except ConfigError as exc:
        raise ConfigError(str(exc.detail).removeprefix("model: "), file=file, key=exc.key or "model") from None


def check_study(study: StudySpec, file: str) -> None:

    space = study.space()
    gpus = study.hardware.total_gpus
    if space.engine == "sglang":
        model = _model_or_error(study.model, file)
        try:
            catalog.get_gpu(study.hardware.gpu)
        except ConfigError as exc:
            raise ConfigError(str(exc).removeprefix("hardware.gpu: "), file=file, key="hardware.gpu") from None
        if study.hardware.gpus_per_node < 1:
            raise ConfigError("an SGLang study needs at least one GPU per node", file=file, key="hardware.gpus_per_node")
        valid_q = {c.sglang_quantization for c in model.checkpoints.values()}
        quant = space.params.get("quantization")
        for i, q in enumerate(quant.grid() if quant else []):
            if q not in valid_q:
                raise ConfigError(f"{model.display_name} has no checkpoint for quantization {q!r}; valid: "
                                  + ", ".join(str(v) for v in sorted(valid_q, key=str)),
                                  file=file, key=f"search_space.params.quantization.values[{i}]")
        for name, value in study.baseline.items():
            if name not in SGLANG_KNOBS:
                raise ConfigError(f"unknown knob{_did_you_mean(name, SGLANG_KNOBS)}", file=file, key=f"baseline.{name}")
            _check_baseline_value(SGLANG_KNOBS[name], value, file, f"baseline.{name}")
        if study.baseline.get("quantization", next(iter(valid_q))) not in valid_q:
            raise ConfigError(f"no checkpoint for quantization {study.baseline['quantization']!r}; valid: "
                              + ", ".join(map(str, valid_q)), file=file, key="baseline.quantization")
        tp_values = [v for v in (space.params["tp-size"].grid() if "tp-size" in space.params else [gpus]) if v]
        for v in tp_values:
            if v > gpus:
                raise ConfigError(f"tp-size {v} needs more GPUs than the study has ({gpus}: "
                                  f"{study.hardware.nodes} node(s) x {study.hardware.gpus_per_node})",
                                  file=file, key="search_space.params.tp-size")
        dp_values = [v for v in (space.params["dp-size"].grid() if "dp-size" in space.params else [1]) if v]
        if min(tp_values) * min(dp_values) > gpus:
            raise ConfigError(f"every tp-size x dp-size combination needs more than the {gpus} GPUs present",
                              file=file, key="search_space.params.dp-size")
        btp = study.baseline.get("tp-size") or study.hardware.gpus_per_node  # null: the default, TP = node
        bdp = study.baseline.get("dp-size", 1) or 1
        if btp * bdp > gpus:
            raise ConfigError(f"baseline tp-size x dp-size = {btp * bdp} > {gpus} GPUs", file=file, key="baseline")
    if study.capacity.max_users < study.target_users:
        raise ConfigError(f"max_users ({study.capacity.max_users}) is below target_users ({study.target_users})",
                          file=file, key="capacity.max_users")


def _check_baseline_value(knob, value, file: str, key: str) -> None:
    """A baseline flag has the knob's type (null leaves SGLang's default)."""
    if value is None:
        return
    if knob.type is bool and not isinstance(value, bool):
        raise ConfigError(f"must be true/false, got {value!r}", file=file, key=key)
    if knob.type is str and not isinstance(value, str):
        raise ConfigError(f"must be a string, got {value!r}", file=file, key=key)
    if knob.type in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"must be a number, got {value!r}", file=file, key=key)
        if knob.type is int and not float(value).is_integer():
            raise ConfigError(f"must be an integer, got {value!r}", file=file, key=key)
        if knob.name in ("tp-size", "dp-size", "attn-dp-size", "ep-size") and value < 1:
            raise ConfigError(f"must be >= 1, got {value!r}", file=file, key=key)
    if knob.choices and value not in knob.choices and knob.name != "quantization":  # checkpoints: below
        raise ConfigError(f"invalid value {value!r}; valid: " + ", ".join(map(str, knob.choices)), file=file, key=key)


def stored_spec_yaml(study: StudySpec) -> str:
    """The study as a database stores it (``tuner_studies.spec_yaml``; ``load_stored_study`` reads it back)."""
    return yaml.safe_dump(study.model_dump(mode="json"), sort_keys=False)


def spec_hash(study: StudySpec) -> str:
    """Hash of everything that changes what a trial measures (not the trial budget, nor how the
    capacity search steps inside a bracket: both bisections conclude the same capacity)."""
    dump = study.model_dump(mode="json", exclude={"trials": True, "source_path": True, "description": True,
                                                  "backend": True, "capacity": {"bisect": True}})
    return hashlib.sha256(yaml.safe_dump(dump, sort_keys=True).encode()).hexdigest()[:16]


def is_comparison_file(path: str | Path) -> bool:
    p = Path(path)
    if p.suffix not in (".yaml", ".yml") or not p.is_file():
        return False
    try:
        return looks_like_comparison(read_yaml(p))
    except ConfigError:
        return False


def comparison_root(spec: ComparisonSpec) -> Path | None:
    """Where a comparison's study names are looked up first (the repository root of its file)."""
    if not spec.source_path:
        return None
    p = Path(spec.source_path).resolve().parent
    return p.parent if p.name == "studies" else p


def load_comparison(name_or_path: str, *, check_studies: bool = False) -> ComparisonSpec:
    """A comparison file (``studies/compare-*.yaml``); with ``check_studies`` every listed study
    file is loaded too, and an error in one names the comparison file and the entry."""
    path = resolve_file(name_or_path, "studies", what="comparison")
    data = read_yaml(path)
    spec = _validate(ComparisonSpec, data, str(path))
    check_costs(spec.gpu_hour_cost, file=str(path), key="gpu_hour_cost")
    spec = spec.model_copy(update={"source_path": str(path)})
    if check_studies:
        for i, name in enumerate(spec.studies):
            try:
                load_study(str(resolve_file(name, "studies", near=comparison_root(spec), what="study")))
            except ConfigError as exc:
                raise ConfigError(f"{name}: {exc}", file=str(path), key=f"studies[{i}]") from None
    return spec


def validate_file(path: str) -> str:
    """Check one file of any kind; return its kind. Raises ConfigError."""
    p = Path(path)
    if not p.exists():
        raise ConfigError("file does not exist", file=path)
    data = read_yaml(p)
    if looks_like_comparison(data):
        load_comparison(str(p), check_studies=True)
        return "comparison"
    if "search_space" in data or "slo" in data:
        load_study(str(p))
        return "study"
    if "params" in data:
        load_search_space(str(p))
        return "search space"

    load_profile(str(p))
    return "workload"


def _default_at(model: type[BaseModel], loc: tuple) -> tuple[bool, Any]:
    """(True, default) of the field at ``loc`` inside ``model`` when it has one."""
    current: Any = model
    for i, part in enumerate(loc):
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return False, None
        info = current.model_fields[part]
        if i == len(loc) - 1:
            if info.default is not PydanticUndefined:
                return True, info.default
            if info.default_factory is not None:
                return True, info.default_factory()
            return False, None
        nxt = None
        for cand in getattr(info.annotation, "__args__", ()) or (info.annotation,):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                nxt = cand
        current = nxt
    return False, None


MAX_STORED_REPAIRS = 32


def results_study(spec_yaml: str, name: str, where: str) -> StudySpec:
    """A study of a results database, for the readers of committed measurements (fidelity,
    calibration, the planner bench): its workload resolved; one this tuner cannot read is a
    ConfigError naming the database."""
    try:
        spec = StudySpec.model_validate(yaml.safe_load(spec_yaml))
        spec.workload_profile()
    except Exception as exc:  # any reason: the reader reports it, naming the file
        raise ConfigError(f"study {name!r}: cannot read its spec: {exc}", file=where) from None
    return spec


def load_stored_study(data: Any, where: str, *, repair: bool) -> tuple[StudySpec, list[str]]:
    """A study as a database stored it, validated by this tuner's (possibly stricter) schema.

    A value this tuner no longer accepts is a ConfigError naming ``where`` and the key, or, with
    ``repair`` (for readers: status, export), is read as the field's default with a note saying
    so. Returns (study, notes)."""
    if not isinstance(data, dict):
        raise ConfigError(f"the stored study is not a mapping (got {type(data).__name__})", file=where)
    notes: list[str] = []
    data = yaml.safe_load(yaml.safe_dump(data))  # a private copy to repair
    for _ in range(MAX_STORED_REPAIRS):
        try:
            return StudySpec.model_validate(data), notes
        except ValidationError as exc:
            if not repair:
                raise format_validation_error(exc, StudySpec, where) from None
            fixed = False
            for err in exc.errors():
                loc = tuple(p for p in err["loc"] if isinstance(p, str) and not p.startswith("function-"))
                has, default = _default_at(StudySpec, loc)
                parent = data
                for part in loc[:-1]:
                    parent = parent.get(part) if isinstance(parent, dict) else None
                if not has or not isinstance(parent, dict) or loc[-1] not in parent:
                    raise format_validation_error(exc, StudySpec, where) from None
                notes.append(f"{where}: {_loc(loc)}: the stored value {parent[loc[-1]]!r} is not valid any more "
                             f"({err['msg'].removeprefix('Value error, ')}); read as the default {default!r}")
                parent[loc[-1]] = default.model_dump() if isinstance(default, BaseModel) else default
                fixed = True
                break  # one at a time: an error can hide another under it
            if not fixed:
                raise format_validation_error(exc, StudySpec, where) from None
    raise ConfigError("the stored study has too many values this tuner does not accept", file=where)
