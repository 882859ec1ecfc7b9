"""SGLang as a process backend: the ``sglang serve`` argv, ``--config`` YAML and environment.

Never imports sglang (it pins its own torch): the plan is argv lists and files, so everything up
to the real launch works on a machine without it. Everything SGLang-shaped comes from the version
the trial launches (``sglang_version_for``): its flag set (``tuner.catalog.sglang_flags``), the
rules of its ``--config`` parser and its endpoints.

What runs is exactly what the study exports: the tuned flags go into ``<trial>/sglang.yaml``
(``config_yaml_dict``/``render_config_yaml``, reused by the exporter) and the command line only
adds what is specific to this launch, plus any tuned flag the version's YAML parser refuses
(0.5.17 keys YAML by ``dest``, so ``--cuda-graph-max-bs-decode`` must be a command-line flag there)::

    sglang serve --config <trial>/sglang.yaml --model-path <checkpoint> --host 127.0.0.1 --port P [flags]

With ``backend_options: {load_format: dummy}`` the model path is a directory holding only the
model's rendered ``config.json`` and SGLang starts with ``--load-format dummy --skip-tokenizer-init``
(random weights of the real shapes); the replay then sends token ids to ``/generate``.
"""

from __future__ import annotations

import getpass
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from tuner.backends import moe_configs
from tuner.paths import user_path
from tuner.backends.base import LaunchPlan, ProcessBackend, cuda_visible_devices, try_get_json
from tuner.backends.process import ServerLaunch, free_port
from tuner.backends.router import plan_topology, router_argv
from tuner.catalog.sglang_flags import (
    DEFAULT_SGLANG_VERSION, FlagSet, load_flagset, parse_extra_args, resolve_version,
)
from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError, TrialError
from tuner.lifecycle import FailureClass
import importlib.metadata
from tuner.config.knobs import SGLANG_KNOBS
from tuner.backends.sglang_log import describe_death, startup_report
from tuner.catalog.hf import write_model_dir
from tuner.catalog.routing import LOAD_FORMAT_FLAG, routed_expert_pool
from tuner.kernels.worth import collapsed_routing_mismatch
from tuner.vocabulary import LoadFormat, names

log = logging.getLogger(__name__)

#: flags tuner sets per launch; never in the tuned flags or the YAML
LAUNCH_FLAGS = ("model-path", "host", "port", "config", "load-format", "skip-tokenizer-init")
DEFAULT_STARTUP_TIMEOUT_S = 1800.0  # a 750B checkpoint loads for many minutes
LOAD_FORMATS = names(LoadFormat)  # what backend_options.load_format may say


# ------------------------------------------------------------------------------------------
# version


def installed_sglang_version() -> str | None:
    """``sglang.__version__`` of the Python that launches servers here, read from its metadata
    (importing sglang would pull its torch); None where SGLang is not installed."""

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_version_for(options: Mapping[str, Any] | None = None, *, file: str | None = None) -> str:
    """The SGLang version a trial launches: ``backend_options.sglang_version`` if the study pins
    one, else the installed package's, else DEFAULT_SGLANG_VERSION (a machine without SGLang)."""
    options = options or {}
    pinned = options.get("sglang_version")
    if pinned is not None:
        return resolve_version(str(pinned), key="backend_options.sglang_version", file=file)
    installed = installed_sglang_version()
    if installed is not None:
        return resolve_version(installed, key="installed sglang")
    return DEFAULT_SGLANG_VERSION


def pinned_server_flags(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``backend_options.server_flags``: flags every trial runs with, the baseline too (e.g. the
    only attention backend a machine has), written into the --config YAML and exported."""
    flags = (options or {}).get("server_flags") or {}
    if not isinstance(flags, Mapping):
        raise ConfigError("must be a mapping of flag name to value, e.g. {attention-backend: triton}",
                          key="backend_options.server_flags")
    return {str(k): v for k, v in flags.items()}


def load_format_of(options: Mapping[str, Any] | None) -> str:
    fmt = str((options or {}).get("load_format", "auto"))
    if fmt not in LOAD_FORMATS:
        raise ConfigError(f"unknown load_format {fmt!r}; valid: {', '.join(LOAD_FORMATS)} (dummy: random "
                          f"weights from the model's config.json, nothing downloaded)",
                          key="backend_options.load_format")
    return fmt


# ------------------------------------------------------------------------------------------
# config YAML


def normalize_flags(flags: Mapping[str, Any], flagset: FlagSet | None = None, *,
                    where: str = "flags") -> dict[str, Any]:
    """Canonical flag names (aliases resolved), ``None`` (= SGLang default) dropped, values checked."""
    fs = flagset or load_flagset()
    names = [k for k, v in flags.items() if v is not None]
    fs.require(names, where=where)
    out: dict[str, Any] = {}
    for key in names:
        canon = fs.canonical(key)
        if canon in out:
            raise ConfigError(f"--{canon} given twice (as {key!r} and under another name)", key=f"{where}.{key}")
        fs.check_value(canon, flags[key], where=where)
        out[canon] = flags[key]
    return out


def config_yaml_dict(flags: Mapping[str, Any], *, model_path: str | None = None,
                     flagset: FlagSet | None = None, cli_overflow: list[str] | None = None) -> dict[str, Any]:
    """The ``--config`` mapping SGLang's ConfigArgumentMerger reads back to the same argv.

    Dash keys (``mem-fraction-static``; underscores would become unknown flags), store_true flags
    only when true, lists and dicts as YAML lists/mappings (SGLang passes dicts as JSON strings).
    A flag the version's config parser refuses raises ConfigError, unless ``cli_overflow`` is given:
    then it is appended there as command-line arguments instead.
    """
    fs = flagset or load_flagset()
    norm = normalize_flags(flags, fs)
    clash = [k for k in norm if k in LAUNCH_FLAGS]
    if clash:
        raise ConfigError(f"{', '.join('--' + c for c in clash)} is set per launch, not a tuned flag",
                          key="flags")
    out: dict[str, Any] = {}
    if model_path is not None:
        out["model-path"] = str(model_path)
    for name in sorted(norm):
        value = norm[name]
        info = fs.info(name)
        if info.config_yaml == "unsupported":
            if cli_overflow is None:
                raise ConfigError(
                    f"--{name} ({info.kind}) cannot go into an SGLang --config file ({fs.version}: its parser "
                    f"rejects it); drop it from the search space", key=f"flags.{name}")
            cli_overflow.extend(flag_argv(info, value))
            continue
        if info.config_yaml == "store_true":
            if value is True:
                out[name] = True
            elif value is not False:
                raise ConfigError(f"--{name} is a switch: true or false, not {value!r}", key=f"flags.{name}")
            continue
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, list) and not value:
            continue  # SGLang skips empty lists too
        out[name] = value
    return out


def flag_argv(info, value: Any) -> list[str]:
    """Command-line arguments for one flag and value (switches only when true)."""

    if info.kind == "store_true" or (info.kind == "custom_action" and info.type == "bool"):
        return [info.cli] if value is True else []
    if info.kind == "boolean_optional":
        return [info.cli if value else f"--no-{info.name}"]
    if isinstance(value, (list, tuple)):
        return [info.cli, *map(str, value)] if value else []
    if isinstance(value, dict):
        return [info.cli, json.dumps(value)]
    if isinstance(value, bool):
        return [info.cli, str(value).lower()]
    return [info.cli, str(value)]


def command_line_flags(flags: Mapping[str, Any], flagset: FlagSet | None = None) -> list[str]:
    """The tuned flags this version's --config parser refuses, as command-line arguments."""
    overflow: list[str] = []
    config_yaml_dict(flags, flagset=flagset, cli_overflow=overflow)
    return overflow


def render_config_yaml(flags: Mapping[str, Any], *, model_path: str | None = None,
                       flagset: FlagSet | None = None, header: str | None = None,
                       cli_overflow: list[str] | None = None) -> str:
    """YAML text of ``config_yaml_dict`` (stable key order), with an optional comment header."""
    body = yaml.safe_dump(config_yaml_dict(flags, model_path=model_path, flagset=flagset,
                                           cli_overflow=cli_overflow),
                          sort_keys=False, default_flow_style=False)
    if body.strip() == "{}":
        body = ""
    if header:
        body = "".join(f"# {ln}\n" for ln in header.splitlines()) + body
    return body


def config_to_argv(config: Mapping[str, Any], flagset: FlagSet | None = None) -> list[str]:
    """What SGLang's ``ConfigArgumentMerger._convert_config_to_args`` makes of a config mapping.

    Kept here so tests can prove the YAML reproduces the intended command line.
    """
    fs = flagset or load_flagset()
    args: list[str] = []
    for key, value in config.items():
        info = fs.info(key)
        if info.config_yaml == "unsupported":
            raise ValueError(f"Unsupported config option '{key.replace('-', '_')}'")
        if isinstance(value, bool):
            if info.config_yaml == "store_true":
                if value:
                    args.append(f"--{key}")
            else:
                args.extend([f"--{key}", str(value).lower()])
        elif isinstance(value, list):
            if value:
                args.append(f"--{key}")
                args.extend(str(v) for v in value)
        elif isinstance(value, dict):
            args.extend([f"--{key}", json.dumps(value)])
        else:
            args.extend([f"--{key}", str(value)])
    return args


# ------------------------------------------------------------------------------------------
def triton_cache_dirs(env: Mapping[str, str]) -> dict[str, Path]:
    """Where a process with ``env`` keeps compiled Triton kernels. ``TRITON_CACHE_DIR`` where set;
    else ``$TRITON_HOME/.triton/cache`` (home by default, ``triton.runtime.cache``) until the
    process loads its first torch.compile kernel: Inductor then points ``TRITON_CACHE_DIR`` at
    ``<inductor cache>/triton/<device>`` (``CachingAutotuner.__init__``; the cache is
    ``TORCHINDUCTOR_CACHE_DIR``, else ``<tmp>/torchinductor_<user>``), and every kernel SGLang
    builds after that lands there. SGLang compiles some ops with torch.compile, so both count."""
    if env.get("TRITON_CACHE_DIR"):
        return {"triton": Path(env["TRITON_CACHE_DIR"])}
    home = Path(env.get("TRITON_HOME") or os.path.expanduser("~"))
    inductor = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser()))
    return {"triton": home / ".triton" / "cache", "inductor_triton": Path(inductor) / "triton"}


def pinned_triton_cache(user_env: Mapping[str, str | None]) -> dict[str, str]:
    """``TRITON_CACHE_DIR`` for a server, set to Triton's own default where neither the user's
    ``backend_options.env`` nor this process's environment sets (or, with None, unsets) it. Unset,
    the first server on a machine that compiles its torch.compile ops caches every later kernel in
    Inductor's directory, and the next server, which finds those ops compiled and so keeps Triton's
    default, looks in the other one and compiles them all again: measured on SGLang 0.5.17, the same
    40 block-fp8 GEMM builds under the same keys, with the same 0.3-1.3 s stalls
    (results/h100-sglang/README.md, "What a fresh server stalls on"). Set, Inductor leaves it, and a
    second server on a cache the first filled stalled on none of the 35 prompts the first stalled
    on 20 of ("The pinned cache, measured")."""
    if "TRITON_CACHE_DIR" in user_env or os.environ.get("TRITON_CACHE_DIR"):
        return {}
    home = user_env.get("TRITON_HOME") or os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return {"TRITON_CACHE_DIR": str(Path(home) / ".triton" / "cache")}


# Flags that set only batch sizes, memory, scheduling and logging: no kernel's binary depends on
# them (the batch sizes a server runs are recorded per server: tuner.evaluation.kernel_ledger), so
# servers that differ only in these share their cached kernels. Every other flag names a kernel set.
SCHEDULING_ONLY_FLAGS = frozenset({
    "max-running-requests", "max-total-tokens", "chunked-prefill-size", "max-prefill-tokens", "mem-fraction-static",
    "cuda-graph-max-bs", "cuda-graph-max-bs-decode", "cuda-graph-bs", "schedule-policy", "schedule-conservativeness",
    "enable-metrics", "log-level", "decode-log-interval", "random-seed", "host", "port", "nccl-port",
    "watchdog-timeout", "stream-interval", "served-model-name", "skip-server-warmup",
})


def kernel_set_parts(flags: Mapping[str, Any], *, sglang_version: str, triton_version: str | None,
                     device_name: str, model_path: str, tile_files: Sequence[str],
                     defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What decides the binaries of the Triton kernels a server builds (``tuner.evaluation.kernel_ledger``):
    the GPU, SGLang's and Triton's versions, the model's config.json (its shapes), every flag but
    ``SCHEDULING_ONLY_FLAGS`` (weight and KV formats, parallel layout, attention backend, ...) and
    the contents of the tile-config files it reads. A flag left out, set to None or set to SGLang's
    own default (``defaults``) is the same server: a baseline's explicit ``tp-size: 1`` names the set
    a sampled trial without it runs."""
    config = Path(model_path) / "config.json"
    return {"engine": "sglang", "sglang_version": sglang_version, "triton_version": triton_version,
            "gpu": device_name, "model": _digest(config) if config.is_file() else str(model_path),
            "flags": kernel_set_flags(flags, defaults),
            "tile_files": {Path(f).name: _digest(Path(f)) for f in sorted(tile_files)}}


def kernel_set_flags(flags: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The flags that name a kernel set (``kernel_set_parts``), sorted: not scheduling-only, not None
    and not SGLang's own default."""
    defaults = defaults or {}
    return {k: flags[k] for k in sorted(flags) if k not in SCHEDULING_ONLY_FLAGS and flags[k] is not None
            and not (k in defaults and flags[k] == defaults[k])}


def flag_defaults(flagset, names) -> dict[str, Any]:
    """SGLang's declared default of each flag of ``names`` that the flag set knows and declares one for."""
    out = {}
    for name in names:
        try:
            default = flagset.info(name).default
        except (KeyError, ConfigError):
            continue
        if default is not None:
            out[name] = default
    return out


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _first_server_env(plan: LaunchPlan) -> dict[str, str] | None:
    """The environment the plan's first server runs with (this process's, under its own; a None
    value unsets); None for a plan without servers."""
    if not plan.servers:
        return None
    return {k: v for k, v in {**os.environ, **plan.servers[0].env}.items() if v is not None}


def jit_cache_dir(env: Mapping[str, str]) -> Path:
    """Where SGLang keeps the CUDA modules it compiles with nvcc on first use (``sglang/kernels/jit``,
    through tvm-ffi): ``TVM_FFI_CACHE_DIR``, else ``~/.cache/tvm-ffi``, one for the whole machine."""
    return user_path(env.get("TVM_FFI_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tvm-ffi"))


def jit_cache_state(cache_dir: Path) -> dict[str, Any]:
    """How many built JIT modules (a ``.so`` each) ``cache_dir`` holds."""
    modules = 0
    if cache_dir.is_dir():
        for _root, _dirs, names in os.walk(cache_dir):
            modules += sum(name.endswith(".so") for name in names)
    return {"dir": str(cache_dir), "modules": modules}


def triton_cache_state(cache_dir: Path) -> dict[str, Any]:
    """How many compiled kernels (a ``.cubin`` or ``.hsaco`` each) and bytes ``cache_dir`` holds."""
    state: dict[str, Any] = {"dir": str(cache_dir), "kernels": 0, "files": 0, "bytes": 0}
    if not cache_dir.is_dir():
        return state
    for root, _dirs, names in os.walk(cache_dir, onerror=lambda exc: state.setdefault("error", str(exc))):
        for name in names:
            try:
                state["bytes"] += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile by another process
                continue
            state["files"] += 1
            state["kernels"] += name.endswith((".cubin", ".hsaco"))
    return state


# command, checkpoint, environment


def server_command(options: Mapping[str, Any] | None = None) -> list[str]:
    """The ``sglang serve`` prefix: option ``server_command``, else the console script next to
    this Python, else on PATH, else ``python -m sglang.launch_server`` (works, with a warning)."""
    options = options or {}
    cmd = options.get("server_command")
    if cmd:
        if isinstance(cmd, str):
            raise ConfigError("server_command must be a list, e.g. ['sglang', 'serve']",
                              key="backend_options.server_command")
        return [str(c) for c in cmd]
    sibling = Path(sys.executable).with_name("sglang")
    if sibling.exists():
        return [str(sibling), "serve"]
    found = shutil.which("sglang")
    if found:
        return [found, "serve"]
    return [sys.executable, "-m", "sglang.launch_server"]


def checkpoint_for(model, quantization: str | None, options: Mapping[str, Any] | None = None, *,
                   allow_override: bool = True):
    """(model path, catalog Checkpoint or None) for the configured ``--quantization``.

    ``backend_options.model_path`` overrides the catalog: a path/id, or a mapping from
    quantization (``bf16`` for none) to path (ignored for dummy weights: the config is rendered).
    """
    options = dict(options or {}) if allow_override else {}
    match = None
    for ck in model.checkpoints.values():
        if ck.sglang_quantization == quantization:
            match = ck
            break
    override = options.get("model_path")
    if isinstance(override, Mapping):
        override = override.get(quantization or "bf16")
    if override:
        return str(override), match
    if match is None:
        have = sorted(str(c.sglang_quantization) for c in model.checkpoints.values())
        raise TrialError(FailureClass.INFEASIBLE, f"{model.name} has no checkpoint for --quantization {quantization}; "
                         f"catalog has {', '.join(have)}")
    return match.hf_id, match


def sglang_argv(config_path: str | Path, model_path: str, host: str, port: int, *,
                command: Sequence[str], extra_args: Sequence[str] = (),
                override_flags: Mapping[str, Any] | None = None) -> list[str]:
    """``<command> --config C --model-path M --host H --port P [overrides] [extra]``."""
    argv = [*command, "--config", str(config_path), "--model-path", str(model_path),
            "--host", host, "--port", str(port)]
    for key, value in (override_flags or {}).items():
        argv.extend([f"--{key}", str(value)])
    argv.extend(extra_args)
    return argv


# ------------------------------------------------------------------------------------------
# the backend


class SGLangBackend(ProcessBackend):
    kind = "sglang"

    def availability(self) -> tuple[bool, str]:
        try:
            found = importlib.util.find_spec("sglang") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return False, "the sglang package is not installed (pip install 'tuner[sglang]')"
        return True, "sglang is installed"

    def gpus_needed(self, request) -> int:
        f = request.flags
        # world size; attention DP splits the TP group and adds none
        return int(f.get("tp-size") or 1) * int(f.get("dp-size") or 1) * int(f.get("pp-size") or 1)

    def build_plan(self, request, trial_dir: Path) -> LaunchPlan:
        """Flags for the trial's SGLang version, the model path (a rendered config.json for dummy
        weights), tile files, the --config YAML, then one launch per server and the router."""
        study = request.study
        options = dict(getattr(study, "backend_options", None) or {})
        fs = load_flagset(_launch_version(options))
        flags = {**normalize_flags(pinned_server_flags(options), fs, where="backend_options.server_flags"),
                 **normalize_flags(request.flags, fs)}
        knobs = dict(request.knobs or {})
        topo = plan_topology(flags, knobs)
        need = self._check_topology(topo, request)
        trial_dir = Path(trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        model = get_model(study.model)
        load_format = load_format_of(options)
        extra = parse_extra_args(options.get("extra_server_args") or [], flagset=fs)
        facts: dict[str, Any] = {"topology": topo.__dict__, "sglang_version": fs.version, "load_format": load_format,
                                 "metrics_enabled": bool(flags.get("enable-metrics")) or "--enable-metrics" in extra}
        files: dict[str, str] = {}
        model_path, checkpoint, launch_args = _model_path(model, flags, options, load_format, trial_dir, files)
        facts["model_path"] = model_path
        moe_env = _tile_files(study, options, model, checkpoint, flags, knobs, topo, trial_dir, files, facts)

        server_flags = dict(flags)
        if topo.replicas_as_processes > 1:  # N router-fronted replicas each run dp-size 1
            server_flags.pop("dp-size", None)
        config_path = trial_dir / "sglang.yaml"
        cli_flags: list[str] = []  # what this version's YAML parser refuses goes on the command line
        config_path.write_text(render_config_yaml(
            server_flags, flagset=fs, cli_overflow=cli_flags,
            header=f"trial {request.trial_number}: SGLang {fs.version} --config (tuned flags only)"))
        files["config"] = str(config_path)
        if cli_flags:
            facts["command_line_flags"] = cli_flags
        if topo.note:
            facts["note"] = topo.note
        facts["kernel_set"] = kernel_set_parts(
            flags, sglang_version=fs.version, triton_version=options.get("triton_version") or
            moe_configs.installed_triton_version(), device_name=get_gpu(study.hardware.gpu).device_name,
            model_path=model_path, tile_files=facts.get("moe_config_files") or [], defaults=flag_defaults(fs, flags))

        servers, router = _launches(options, topo, flags, tuple(request.gpu_ids), need, trial_dir, config_path,
                                    model_path, [*launch_args, *cli_flags, *extra], moe_env)
        token_ids = load_format == LoadFormat.DUMMY or bool(flags.get("skip-tokenizer-init")) or \
            "--skip-tokenizer-init" in extra
        return LaunchPlan(servers=servers, router=router, api="generate" if token_ids else "completions",
                          served_model=model_path, vocab_size=model.vocab_size, files=files, facts=facts,
                          use_server_output_ids=token_ids)

    def _check_topology(self, topo, request) -> int:
        """GPUs the trial needs (TrialError infeasible for what SGLang refuses or too few GPUs)."""
        if topo.dp_size > 1 and topo.attn_dp_size > 1:
            raise TrialError(FailureClass.INFEASIBLE, "SGLang rejects attn-dp-size > 1 together with dp-size > 1")
        if topo.tp_size % topo.attn_dp_size:
            raise TrialError(FailureClass.INFEASIBLE,
                             f"tp-size {topo.tp_size} is not a multiple of attn-dp-size {topo.attn_dp_size}")
        need = self.gpus_needed(request)
        if request.gpu_ids and len(request.gpu_ids) < need:
            raise TrialError(FailureClass.INFEASIBLE, f"configuration needs {need} GPUs, {len(request.gpu_ids)} assigned")
        return need

    def metrics_urls(self, plan: LaunchPlan) -> list[str]:
        if not plan.facts.get("metrics_enabled"):
            return []
        return [s.base_url + "/metrics" for s in plan.servers]

    def startup_failure_detail(self, log_text: str) -> str:

        return describe_death(startup_report(log_text, exited=True))

    def kernel_cache_state(self, plan: LaunchPlan) -> dict[str, Any] | None:
        """Triton's on-disk cache as the first server will see it (SGLang's Triton kernels, fused MoE,
        block-fp8 linears and attention, compile on first use unless a build is cached there), and
        under ``jit`` the machine's cache of SGLang's nvcc-built CUDA modules."""
        env = _first_server_env(plan)
        if env is None:
            return None
        state: dict[str, Any] = {name: triton_cache_state(d) for name, d in triton_cache_dirs(env).items()}
        state["jit"] = jit_cache_state(jit_cache_dir(env))  # SGLang's nvcc-built modules
        return state

    def kernel_cache_dir(self, plan: LaunchPlan) -> Path | None:
        """The Triton cache directory the servers share where it is pinned (``TRITON_CACHE_DIR``
        set, as ``pinned_triton_cache`` sets it); None where it is not, and Inductor may move it."""
        env = _first_server_env(plan)
        return Path(env["TRITON_CACHE_DIR"]) if env and env.get("TRITON_CACHE_DIR") else None

    def kernel_set(self, plan: LaunchPlan) -> dict[str, Any] | None:
        return plan.facts.get("kernel_set")

    def server_facts(self, plan: LaunchPlan) -> dict[str, Any]:
        """KV capacity from every server's ``/server_info`` (domain.md §C5), and what each
        server's log says about its start-up (weights, KV pool, CUDA-graph capture times)."""

        infos = [try_get_json(s.base_url + "/server_info", 60.0) for s in plan.servers]
        startup = []
        for spec, info in zip(plan.servers, infos):
            if info is not None and spec.log_path:  # the whole snapshot beside the log, for the record

                try:
                    Path(spec.log_path).with_suffix(".server_info.json").write_text(
                        json.dumps(info, indent=1, sort_keys=True, default=str))
                except OSError:
                    pass
            try:
                text = Path(spec.log_path).read_text(errors="replace") if spec.log_path else ""
            except OSError:
                text = ""
            startup.append(startup_report(text).to_dict())
        total = 0
        known = True
        per_server = []
        for info in infos:
            tokens = kv_capacity_from_server_info(info) if info else None
            per_server.append(tokens)
            if tokens is None:
                known = False
            else:
                total += tokens
        return {
            "kv_capacity_tokens_total": total if known and infos else None,
            "kv_capacity_tokens_per_server": per_server,
            "server_info": [_trim_server_info(i) for i in infos],
            "startup": startup,
        }


def _launch_version(options: Mapping[str, Any]) -> str:
    """The version this trial launches; a study pinned to another version than the installed one
    is refused (its flags were checked against the pinned one)."""
    version = sglang_version_for(options)
    installed = installed_sglang_version()
    if installed is not None and resolve_version(installed, key="installed sglang") != version:
        raise ConfigError(f"the study targets SGLang {version} (backend_options.sglang_version) but "
                          f"SGLang {installed} is installed where the trial runs", key="backend_options.sglang_version")
    return version


def _model_path(model, flags, options, load_format: str, trial_dir: Path, files: dict):
    """(model path, catalog checkpoint, launch-only arguments): the checkpoint's path, or for dummy
    weights a directory holding only the model's rendered config.json."""
    model_path, checkpoint = checkpoint_for(model, flags.get("quantization"), options,
                                            allow_override=load_format != LoadFormat.DUMMY)
    if load_format != LoadFormat.DUMMY:
        return model_path, checkpoint, []
    fmt = checkpoint.weight_format if checkpoint is not None else "bf16"
    model_dir = write_model_dir(model, fmt, trial_dir / "model")
    files["model_config"] = str(model_dir / "config.json")
    return str(model_dir.resolve()), checkpoint, ["--load-format", LoadFormat.DUMMY.value, "--skip-tokenizer-init"]


def _tile_files(study, options, model, checkpoint, flags, knobs, topo, trial_dir: Path, files: dict,
                facts: dict) -> dict[str, str | None]:
    """The environment that points SGLang at tuned MoE / GEMM tile files (or at its own)."""
    choice = knobs.get("moe-tile-configs", "default")
    if choice == "default":
        return moe_configs.env_for(None)
    if choice != "tuned":
        raise ConfigError(f"moe-tile-configs must be default or tuned, not {choice!r}", key="knobs.moe-tile-configs")
    source = moe_configs.tuned_source_dir(options, study.hardware.gpu)
    if not source.is_dir():
        raise ConfigError(f"moe-tile-configs: tuned needs tuned tile files; {str(source)!r} does not exist "
                          f"(run `tuner kernels tune`, or set backend_options.moe_config_dir)",
                          key="backend_options.moe_config_dir")
    fusion = not flags.get("disable-shared-experts-fusion", False)
    gpu = get_gpu(study.hardware.gpu)
    required = moe_configs.trial_config_keys(
        model, gpu, checkpoint.weight_format, tp_size=topo.tp_size, ep_size=int(flags.get("ep-size") or 1),
        shared_experts_fusion=fusion) if checkpoint is not None and model.is_moe else []
    required_gemm = moe_configs.trial_gemm_file_names(
        model, gpu, checkpoint.weight_format, tp_size=topo.tp_size,
        attn_tp_size=topo.tp_size // max(1, topo.attn_dp_size), shared_experts_fusion=fusion) if checkpoint else []
    tiles = moe_configs.prepare_trial_tile_configs(trial_dir, source, triton_version=options.get("triton_version"),
                                                   required=required, required_gemm=required_gemm)
    files["moe_config_dir"] = str(tiles.moe_dir)
    if tiles.gemm_site is not None:
        files["gemm_config_site"] = str(tiles.gemm_site)
    facts["moe_config_files"] = list(tiles.moe_files) + list(tiles.gemm_files)
    facts["tile_files_expected"] = tiles.expected
    facts["tile_keys_from_sglang"] = tiles.filled_from_sglang
    facts["tile_files_required"] = [k.file_name for k in required] + list(required_gemm)
    if checkpoint is not None and routed_expert_pool(model, {LOAD_FORMAT_FLAG: facts.get("load_format")}) is not None:
        # random weights under a biased gate: tiles tuned with tokens routed apart run slower than SGLang's own
        why = collapsed_routing_mismatch(model.name, gpu.device_name, checkpoint.weight_format, tp_size=topo.tp_size,
                                         ep_size=int(flags.get("ep-size") or 1), tuned_dir=source,
                                         shared_experts_fusion=fusion)
        if why is not None:
            facts["tile_routing_warning"] = why
            log.warning("%s", why)
    user_pythonpath = (options.get("env") or {}).get("PYTHONPATH")
    return tiles.env(inherited_pythonpath=user_pythonpath or os.environ.get("PYTHONPATH"))


def _launches(options, topo, flags, gpu_ids: tuple, need: int, trial_dir: Path, config_path: Path, model_path: str,
              extra_args: list[str], moe_env: dict) -> tuple[list[ServerLaunch], ServerLaunch | None]:
    """One launch per server process (router-fronted replicas each get their own GPUs and ports),
    then the router in front of them if the topology has one."""
    host = str(options.get("host", "127.0.0.1"))
    timeout = float(options.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S))
    command = server_command(options)
    user_env = {str(k): (None if v is None else str(v)) for k, v in (options.get("env") or {}).items()}
    replicas = topo.replicas_as_processes
    per = topo.tp_size * int(flags.get("pp-size") or 1)
    servers: list[ServerLaunch] = []
    used_ports: list[int] = []
    for i in range(replicas):
        port = free_port(host, avoid=used_ports)
        used_ports.append(port)
        ids = gpu_ids[i * per:(i + 1) * per] if replicas > 1 else gpu_ids[:need]
        # the user's env over the pinned kernel cache; moe_env last: it may extend PYTHONPATH
        env = {**cuda_visible_devices(ids), **pinned_triton_cache(user_env), **user_env, **moe_env}
        overrides = {"nccl-port": free_port(host, avoid=used_ports)} if replicas > 1 else {}  # own dist-init port
        used_ports.extend(overrides.values())
        servers.append(ServerLaunch(
            name=f"sglang{i}" if replicas > 1 else "sglang",
            argv=sglang_argv(config_path, model_path, host, port, command=command, extra_args=extra_args,
                             override_flags=overrides),
            port=port, host=host, env=env, log_path=str(trial_dir / f"sglang{i}.log"),
            ready_paths=("/health",), startup_timeout_s=timeout, ready_request_timeout_s=60.0))
    if not topo.uses_router:
        return servers, None
    rport = free_port(host, avoid=used_ports)
    router = ServerLaunch(
        name="router",
        argv=router_argv([s.base_url for s in servers], topo.router_policy, host, rport, dp_aware=topo.dp_aware,
                         python=options.get("router_python"),
                         extra=[str(a) for a in options.get("extra_router_args") or []]),
        port=rport, host=host, env=user_env, log_path=str(trial_dir / "router.log"),
        ready_paths=("/health",), startup_timeout_s=min(timeout, 300.0))
    return servers, router


def _find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(obj, list):
        for v in obj:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def kv_capacity_from_server_info(info: Mapping[str, Any]) -> int | None:
    """KV tokens of one server over all its DP ranks.

    ``max_total_num_tokens`` is rank 0 of DP only, so it is multiplied by the DP ranks (attention
    DP inside the TP group, or ``dp_size`` replicas under the internal DP controller). When
    ``internal_states`` reports ``memory_usage.token_capacity`` for every rank, their sum is used.
    """
    states = info.get("internal_states")
    if isinstance(states, list) and states:
        caps = [(_find_key(s, "memory_usage") or {}).get("token_capacity") if isinstance(s, Mapping) else None
                for s in states]
        if all(isinstance(c, (int, float)) and c > 0 for c in caps):
            ranks = _dp_ranks(info)
            if len(caps) == ranks:
                return int(sum(caps))
    tokens = _find_key(info, "max_total_num_tokens")
    if not isinstance(tokens, (int, float)) or tokens <= 0:
        return None
    return int(tokens) * _dp_ranks(info)


def _dp_ranks(info: Mapping[str, Any]) -> int:
    attn = info.get("attn_dp_size") or 1
    dp = info.get("dp_size") or 1
    return int(attn) * int(dp)


def _trim_server_info(info: Any) -> Any:
    """Keep the record small: the resolved args and memory facts, not huge nested blobs."""
    if not isinstance(info, Mapping):
        return None
    keep = ("version", "max_total_num_tokens", "max_req_input_len", "startup_time", "tp_size", "dp_size",
            "attn_dp_size", "ep_size", "mem_fraction_static", "chunked_prefill_size", "max_running_requests",
            "kv_cache_dtype", "page_size", "cuda_graph_max_bs_decode", "cuda_graph_config", "quantization",
            "attention_backend", "sampling_backend", "enable_dp_attention", "enable_hierarchical_cache",
            "hicache_ratio", "hicache_size", "schedule_policy", "max_prefill_tokens", "disable_radix_cache",
            "load_format", "context_length", "internal_states", "launch_command")
    return {k: info[k] for k in keep if k in info}


# ------------------------------------------------------------------------------------------
# checks before a study starts


def check_study_flags(spec, *, version: str | None = None) -> str:
    """Every SGLang flag a study can emit exists in the target version, with valid values.

    Looks at the search space's server knobs and their values, the baseline, the pinned
    ``server_flags`` and ``extra_server_args``; raises ConfigError (exit 2) naming the file, the
    key and what the version offers instead. Returns the version checked against.
    """

    options = dict(spec.backend_options or {})
    file = spec.source_path
    version = version or sglang_version_for(options, file=file)
    fs = load_flagset(version)
    load_format_of(options)

    def require(name: str, key: str) -> None:
        if name not in fs:
            raise ConfigError(f"--{name} is not a flag of SGLang {fs.version}{fs.suggest(name)}", file=file, key=key)

    def check(name: str, value: Any, key: str) -> None:
        try:
            fs.check_value(name, value, where=key.rsplit(".", 1)[0])
        except ConfigError as exc:
            raise ConfigError(f"{exc.detail} (SGLang {fs.version})", file=file, key=key) from None

    space = spec.space()
    for name, p in space.params.items():
        knob = SGLANG_KNOBS.get(name)
        if knob is not None and knob.scope == "tuner":
            continue
        key = f"search_space.params.{name}"
        require(name, key)
        for i, v in enumerate(p.grid() if p.values is not None else []):
            if v is not None:
                check(name, v, f"{key}.values[{i}]")
    for name, value in (spec.baseline or {}).items():
        knob = SGLANG_KNOBS.get(name)
        if knob is not None and knob.scope == "tuner":
            continue
        require(name, f"baseline.{name}")
        if value is not None:
            check(name, value, f"baseline.{name}")
    for name, value in pinned_server_flags(options).items():
        require(name, f"backend_options.server_flags.{name}")
        if fs.canonical(name) in LAUNCH_FLAGS:
            raise ConfigError(f"--{name} is set by tuner per launch", file=file, key=f"backend_options.server_flags.{name}")
        check(name, value, f"backend_options.server_flags.{name}")
    try:
        parse_extra_args(options.get("extra_server_args") or [], flagset=fs)
    except ConfigError as exc:
        raise ConfigError(f"{exc.detail} (SGLang {fs.version})", file=file,
                          key=exc.key or "backend_options.extra_server_args") from None
    return fs.version
