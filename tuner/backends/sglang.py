"""SGLang 0.5.23 as a process backend: the ``sglang serve`` argv, ``--config`` YAML and environment.

Never imports sglang (it pins its own torch): the plan is argv lists and files, so everything up
to the real launch works on a machine without it.

What runs is exactly what the study exports: the tuned flags go into ``<trial>/sglang.yaml``
(``config_yaml_dict``/``render_config_yaml``, reused by the exporter) and the command line only
adds what is specific to this launch::

    sglang serve --config <trial>/sglang.yaml --model-path <checkpoint> --host 127.0.0.1 --port P
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from tuner.backends import moe_configs
from tuner.backends.base import LaunchPlan, ProcessBackend, cuda_visible_devices, try_get_json
from tuner.backends.process import ServerLaunch, free_port
from tuner.backends.router import plan_topology, router_argv
from tuner.backends.sglang_flags import FlagSet, load_flagset, parse_extra_args
from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError, TrialError
from tuner.lifecycle import FailureClass

log = logging.getLogger(__name__)

#: flags tuner sets per launch; never in the tuned flags or the YAML
LAUNCH_FLAGS = ("model-path", "host", "port", "config")
DEFAULT_STARTUP_TIMEOUT_S = 1800.0  # a 750B checkpoint loads for many minutes


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
                     flagset: FlagSet | None = None) -> dict[str, Any]:
    """The ``--config`` mapping SGLang's ConfigArgumentMerger reads back to the same argv.

    Dash keys (``mem-fraction-static``; underscores would become unknown flags), store_true flags
    only when true, lists and dicts as YAML lists/mappings (SGLang passes dicts as JSON strings).
    Flags the config parser refuses (BooleanOptionalAction, zero-argument custom actions) raise
    ConfigError: they cannot be reproduced from a config file.
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
            raise ConfigError(
                f"--{name} ({info.kind}) cannot go into an SGLang --config file (SGLang's parser rejects "
                f"it); drop it from the search space", key=f"flags.{name}")
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


def render_config_yaml(flags: Mapping[str, Any], *, model_path: str | None = None,
                       flagset: FlagSet | None = None, header: str | None = None) -> str:
    """YAML text of ``config_yaml_dict`` (stable key order), with an optional comment header."""
    body = yaml.safe_dump(config_yaml_dict(flags, model_path=model_path, flagset=flagset),
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


def checkpoint_for(model, quantization: str | None, options: Mapping[str, Any] | None = None):
    """(model path, catalog Checkpoint or None) for the configured ``--quantization``.

    ``backend_options.model_path`` overrides the catalog: a path/id, or a mapping from
    quantization (``bf16`` for none) to path.
    """
    options = options or {}
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
        study = request.study
        options = dict(getattr(study, "backend_options", None) or {})
        fs = load_flagset()
        flags = normalize_flags(request.flags, fs)
        knobs = dict(request.knobs or {})
        topo = plan_topology(flags, knobs)
        if topo.dp_size > 1 and topo.attn_dp_size > 1:
            raise TrialError(FailureClass.INFEASIBLE, "SGLang rejects attn-dp-size > 1 together with dp-size > 1")
        if topo.tp_size % topo.attn_dp_size:
            raise TrialError(FailureClass.INFEASIBLE, f"tp-size {topo.tp_size} is not a multiple of attn-dp-size {topo.attn_dp_size}")
        need = self.gpus_needed(request)
        gpu_ids = tuple(request.gpu_ids)
        if gpu_ids and len(gpu_ids) < need:
            raise TrialError(FailureClass.INFEASIBLE, f"configuration needs {need} GPUs, {len(gpu_ids)} assigned")

        model = get_model(study.model)
        model_path, checkpoint = checkpoint_for(model, flags.get("quantization"), options)
        host = str(options.get("host", "127.0.0.1"))
        extra = parse_extra_args(options.get("extra_server_args") or [], flagset=fs)
        timeout = float(options.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S))
        trial_dir = Path(trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)

        # MoE tile configs
        moe_env = moe_configs.env_for(None)
        files: dict[str, str] = {}
        facts: dict[str, Any] = {"topology": topo.__dict__, "model_path": model_path}
        if knobs.get("moe-tile-configs", "default") == "tuned":
            source = options.get("moe_config_dir")
            if not source:
                raise ConfigError("moe-tile-configs: tuned needs backend_options.moe_config_dir "
                                  "(e.g. results/kernels/h200)", key="backend_options.moe_config_dir")
            required = []
            if checkpoint is not None and model.is_moe:
                required = moe_configs.trial_config_keys(
                    model, get_gpu(study.hardware.gpu), checkpoint.weight_format,
                    tp_size=topo.tp_size, ep_size=int(flags.get("ep-size") or 1),
                    shared_experts_fusion=not flags.get("disable-shared-experts-fusion", False))
            moe_dir, written = moe_configs.prepare_trial_moe_dir(
                trial_dir, source, triton_version=options.get("triton_version"), required=required)
            moe_env = moe_configs.env_for(moe_dir)
            files["moe_config_dir"] = str(moe_dir)
            facts["moe_config_files"] = written
        elif knobs.get("moe-tile-configs", "default") != "default":
            raise ConfigError(f"moe-tile-configs must be default or tuned, not {knobs['moe-tile-configs']!r}",
                              key="knobs.moe-tile-configs")

        # per-process flags: N router-fronted replicas each run dp-size 1
        server_flags = dict(flags)
        if topo.replicas_as_processes > 1:
            server_flags.pop("dp-size", None)
        config_path = trial_dir / "sglang.yaml"
        config_path.write_text(render_config_yaml(
            server_flags, flagset=fs,
            header=f"trial {request.trial_number}: SGLang {fs.version} --config (tuned flags only)"))
        files["config"] = str(config_path)

        command = server_command(options)
        user_env = {str(k): (None if v is None else str(v)) for k, v in (options.get("env") or {}).items()}
        servers: list[ServerLaunch] = []
        used_ports: list[int] = []
        per = topo.tp_size * int(flags.get("pp-size") or 1)
        for i in range(topo.replicas_as_processes):
            port = free_port(host, avoid=used_ports)
            used_ports.append(port)
            ids = gpu_ids[i * per:(i + 1) * per] if topo.replicas_as_processes > 1 else gpu_ids[:need]
            env = {**cuda_visible_devices(ids), **moe_env, **user_env}
            # each replica needs its own distributed-init port
            overrides = {"nccl-port": free_port(host, avoid=used_ports)} if topo.replicas_as_processes > 1 else {}
            used_ports.extend(overrides.values())
            servers.append(ServerLaunch(
                name=f"sglang{i}" if topo.replicas_as_processes > 1 else "sglang",
                argv=sglang_argv(config_path, model_path, host, port, command=command,
                                 extra_args=extra, override_flags=overrides),
                port=port, host=host, env=env, log_path=str(trial_dir / f"sglang{i}.log"),
                ready_paths=("/health",), startup_timeout_s=timeout, ready_request_timeout_s=60.0,
            ))
        router = None
        if topo.uses_router:
            rport = free_port(host, avoid=used_ports)
            router = ServerLaunch(
                name="router",
                argv=router_argv([s.base_url for s in servers], topo.router_policy, host, rport,
                                 dp_aware=topo.dp_aware, python=options.get("router_python"),
                                 extra=[str(a) for a in options.get("extra_router_args") or []]),
                port=rport, host=host, env=user_env, log_path=str(trial_dir / "router.log"),
                ready_paths=("/health",), startup_timeout_s=min(timeout, 300.0),
            )
        if topo.note:
            facts["note"] = topo.note
        return LaunchPlan(servers=servers, router=router, api="completions", served_model=model_path,
                          vocab_size=model.vocab_size, files=files, facts=facts)

    def server_facts(self, plan: LaunchPlan) -> dict[str, Any]:
        """KV capacity from every server's ``/server_info`` (domain.md §C5)."""
        infos = [try_get_json(s.base_url + "/server_info", 60.0) for s in plan.servers]
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
        }


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
            "kv_cache_dtype", "page_size", "cuda_graph_max_bs_decode", "quantization", "attention_backend",
            "internal_states", "launch_command")
    return {k: info[k] for k in keep if k in info}
