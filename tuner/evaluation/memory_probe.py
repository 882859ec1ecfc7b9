"""Memory probes on a GPU: start SGLang for each configuration of a planner matrix only until
``/server_info`` answers (or start-up fails), keep the snapshot and the log, stop it.

A probe answers what the planner predicts (KV tokens, weight memory, whether start-up fits)
without a load test: a few minutes per configuration, less where CUDA graphs are left out. Graphs
do not change the KV pool when ``mem-fraction-static`` is given (SGLang sizes the pool before
capturing them; only the *default* fraction reserves memory for graphs), so the matrix may turn
them off there (``cuda_graphs: false``) and must keep them where it checks a default fraction or a
start-up out-of-memory in graph capture.

Each configuration becomes ``<out>/<name>.json`` (format ``tuner-planner-probe/1``, read by
``tuner bench planner``) beside ``<name>.log.gz``. A configuration already probed is skipped
unless ``force``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tuner.backends.base import try_get_json
from tuner.backends.process import ServerProcess
from tuner.backends.sglang import SGLangBackend, pinned_server_flags, sglang_version_for
from tuner.catalog import ModelRef
from tuner import safewrite
from tuner.errors import ConfigError, TrialError
from tuner.planner.parallel import flag_float
from tuner.safeyaml import load_file

PROBE_FORMAT = "tuner-planner-probe/1"


class ProbeConfiguration(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    model: str | ModelRef
    flags: dict[str, Any] = Field(default_factory=dict)
    cuda_graphs: bool = True  # false: --disable-cuda-graph (only where it leaves the KV pool unchanged)
    why: str = ""  # what this configuration checks


class ProbeHardware(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: str
    gpus_per_node: int = Field(default=1, ge=1)
    nodes: int = Field(default=1, ge=1)
    host_memory_gb: float | None = None


class PlannerMatrix(BaseModel):
    """A planner-probe matrix file."""

    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    hardware: ProbeHardware
    backend_options: dict[str, Any] = Field(default_factory=dict)
    configurations: list[ProbeConfiguration] = Field(min_length=1)

    @field_validator("configurations")
    @classmethod
    def _unique_and_safe(cls, confs: list[ProbeConfiguration]) -> list[ProbeConfiguration]:
        names = [c.name for c in confs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"configuration names must be unique; repeated: {dup}")
        for c in confs:
            if not c.cuda_graphs and flag_float(c.flags, "mem-fraction-static") is None:
                raise ValueError(f"{c.name}: cuda_graphs: false changes SGLang's default mem-fraction-static "
                                 "(it reserves memory for the graphs); give mem-fraction-static or keep the graphs")
        return confs


def load_matrix(path: str | Path) -> PlannerMatrix:
    path = Path(path)
    data = load_file(path)
    try:
        return PlannerMatrix.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(err["msg"], file=str(path), key=".".join(str(x) for x in err["loc"])) from None


@dataclasses.dataclass
class _Study:
    """What the SGLang backend reads of a study to build a launch plan."""

    model: Any
    hardware: ProbeHardware
    backend_options: dict


@dataclasses.dataclass
class _Request:
    study: _Study
    flags: dict
    knobs: dict
    gpu_ids: tuple
    trial_number: int


def probe_flags(matrix: PlannerMatrix, conf: ProbeConfiguration) -> dict[str, Any]:
    """The flags the server runs with (the matrix's pinned flags, the configuration's, and no
    CUDA graphs where asked): what the planner must be given to predict it."""
    flags = {**pinned_server_flags(matrix.backend_options), **conf.flags}
    if not conf.cuda_graphs:
        flags["disable-cuda-graph"] = True
    return flags


def run_probe(matrix: PlannerMatrix, conf: ProbeConfiguration, out_dir: Path, *, index: int = 0,
              gpu_ids: tuple = ()) -> dict:
    """Start, wait for ``/server_info`` or a start-up failure, stop; returns the probe document."""
    work = out_dir / f".{conf.name}"
    flags = probe_flags(matrix, conf)
    options = {**matrix.backend_options, "server_flags": {}}  # pinned flags are in ``flags`` already
    request = _Request(_Study(conf.model, matrix.hardware, options), flags, {}, tuple(gpu_ids), index)
    plan = SGLangBackend().build_plan(request, work)
    if len(plan.servers) != 1 or plan.router is not None:
        raise ConfigError(f"{conf.name}: a probe starts one server process (no router, dp-size 1)",
                          key=f"configurations[{index}]")
    spec = dataclasses.replace(plan.servers[0], ready_paths=("/server_info",))
    server = ServerProcess(spec)
    started, failure, info, ready_s = False, None, None, None
    t0 = time.monotonic()
    try:
        server.start()
        ready_s = server.wait_ready()
        info = try_get_json(spec.base_url + "/server_info", 60.0)
        started = info is not None
        if not started:
            failure = "/server_info answered but returned no JSON"
    except TrialError as exc:
        failure = f"{exc.failure_class}: {exc}"
    finally:
        server.stop()
    log_name = f"{conf.name}.log.gz"
    try:
        with open(spec.log_path, "rb") as src, gzip.open(out_dir / log_name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except OSError:
        log_name = None
    doc = {
        "format": PROBE_FORMAT, "name": conf.name, "why": conf.why,
        "model": conf.model if isinstance(conf.model, str) else conf.model.model_dump(exclude={"hf_config"}),
        "gpu": matrix.hardware.gpu, "gpus": matrix.hardware.gpus_per_node, "nodes": matrix.hardware.nodes,
        "host_memory_gb": matrix.hardware.host_memory_gb, "flags": flags,
        "sglang_version": sglang_version_for(matrix.backend_options), "started": started, "failure": failure,
        "server_info": info, "log": log_name, "ready_after_s": ready_s, "wall_s": round(time.monotonic() - t0, 1),
        "provenance": {"matrix": matrix.name, "argv": list(spec.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S")},
    }
    safewrite.write_text(out_dir / f"{conf.name}.json", json.dumps(doc, indent=1, default=str) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return doc


def run_matrix(matrix: PlannerMatrix, out_dir: str | Path, *, only: tuple[str, ...] = (), force: bool = False,
               gpu_ids: tuple = (), progress: Callable[[str], None] | None = None) -> list[dict]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    unknown = set(only) - {c.name for c in matrix.configurations}
    if unknown:
        raise ConfigError(f"no such configuration {sorted(unknown)}; the matrix has "
                          f"{', '.join(c.name for c in matrix.configurations)}", key="--only")
    done = []
    for i, conf in enumerate(matrix.configurations):
        if only and conf.name not in only:
            continue
        if (out_dir / f"{conf.name}.json").exists() and not force:
            if progress:
                progress(f"{conf.name}: probed already ({out_dir / (conf.name + '.json')}), skipped")
            continue
        if progress:
            progress(f"[{i + 1}/{len(matrix.configurations)}] {conf.name}: starting SGLang until /server_info answers")
        doc = run_probe(matrix, conf, out_dir, index=i, gpu_ids=gpu_ids)
        if progress:
            tokens = (doc["server_info"] or {}).get("max_total_num_tokens")
            progress(f"    {'started' if doc['started'] else 'did not start'} in {doc['wall_s']} s"
                     + (f", max_total_num_tokens {tokens:,}" if tokens else "")
                     + (f": {doc['failure'][:200]}" if doc["failure"] else ""))
        done.append(doc)
    return done
