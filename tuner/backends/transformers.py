"""``transformers serve`` as a process backend: a real engine end to end where SGLang cannot run.

The tuned knobs are ``transformers serve``'s own flags by their CLI names without dashes
(``continuous-batching``, ``cb-block-size``, ``cb-num-blocks``, ``cb-max-batch-tokens``,
``cb-max-memory-percent``, ``cb-use-cuda-graph``, ``attn-implementation``, ``dtype``, ``compile``,
``device`` ...). Which flags exist is read from ``transformers serve --help`` of the installed
version (cached per version), so an unknown knob is refused before launch with the valid list.

One launch::

    transformers serve <model_dir> --host 127.0.0.1 --port P --log-level info [tuned flags]

with ``HF_HUB_OFFLINE=1``: nothing is fetched from a hub. The server preloads the model before
``/health`` answers; the first generation is much slower (continuous-batching cache allocation,
kernel warm-up), so ``server_facts`` sends one warm-up request before anything is measured and
checks that the token counts the server streams equal what was asked for.

The load goes to ``/v1/completions`` with text prompts (the server refuses token-id prompts) and
without ``ignore_eos`` (it answers 422 to unknown fields); with the local models of
``tuner.tinymodels`` every prompt word is one token and outputs always run to ``max_tokens``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from tuner.paths import user_path
from tuner.backends.base import LaunchPlan, ProcessBackend, cuda_visible_devices, try_get_json
from tuner.backends.process import ServerLaunch, free_port
from tuner.errors import BackendUnavailableError, ConfigError, TrialError
from tuner.lifecycle import FailureClass
from tuner.tinymodels.tiny import TinyModelShape, make_tiny_model, spec_field_names
from tuner.tinymodels.tokenizer import words_text

log = logging.getLogger(__name__)

#: flags tuner sets per launch; never tuned
LAUNCH_FLAGS = ("host", "port", "log-level", "model-timeout", "help")
#: help-text options that are not server settings (output formatting of the CLI itself)
_NOT_SERVER_FLAGS = {"help", "format", "json", "quiet", "no-truncate", "non-blocking"}
DEFAULT_STARTUP_TIMEOUT_S = 600.0
WARMUP_PROMPT_TOKENS = 32
WARMUP_MAX_TOKENS = 8


# ------------------------------------------------------------------------------------------
# the installed version's flags


@dataclass(frozen=True)
class ServeFlag:
    name: str  # without dashes: "cb-block-size"
    kind: str  # "bool" (--x / --no-x), "int", "float", "str" or "choice"
    choices: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "choices": list(self.choices)}


_OPTION_RE = re.compile(
    r"^\s{1,8}(?:-\w,\s*)?--(?P<name>[a-z0-9][a-z0-9-]*)"
    r"(?:\s*/\s*--no-(?P<neg>[a-z0-9-]+))?"
    r"(?:[ =](?P<meta>\[[^\]]*\]|\{[^}]*\}|[A-Z][A-Z_]*))?"
)
_META_KIND = {"INTEGER": "int", "INT": "int", "FLOAT": "float", "TEXT": "str", "PATH": "str"}


def parse_serve_help(text: str) -> dict[str, ServeFlag]:
    """Flags of ``transformers serve --help`` (typer/click layout; argparse's also parses)."""
    flags: dict[str, ServeFlag] = {}
    for line in text.splitlines():
        m = _OPTION_RE.match(line)
        if not m:
            continue
        name = m.group("name")
        if name in _NOT_SERVER_FLAGS or name in flags:
            continue
        meta = m.group("meta")
        if m.group("neg") is not None:
            flags[name] = ServeFlag(name, "bool")
        elif meta is None:
            flags[name] = ServeFlag(name, "bool")  # a bare switch
        elif meta[0] in "[{":
            choices = tuple(c.strip() for c in re.split(r"[|,]", meta[1:-1]) if c.strip())
            flags[name] = ServeFlag(name, "choice", choices)
        else:
            flags[name] = ServeFlag(name, _META_KIND.get(meta, "str"))
    return flags


def serve_command() -> list[str]:
    """argv prefix that runs the CLI of the transformers installed for this Python."""
    exe = Path(sys.executable).parent / "transformers"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("transformers")
    if found:
        return [found]
    return [sys.executable, "-m", "transformers.cli.transformers"]


def transformers_version() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


_FLAGS_LOCK = threading.Lock()
_FLAGS_CACHE: dict[str, dict[str, ServeFlag]] = {}


def _cache_file(version: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "tuner" / f"transformers-serve-flags-{version}.json"


def installed_flags() -> dict[str, ServeFlag]:
    """Server flags of the installed ``transformers serve``; ``--help`` runs once per version."""
    version = transformers_version()
    if version is None:
        raise ConfigError("transformers is not installed; pip install 'transformers[serving]'",
                          key="backend")
    with _FLAGS_LOCK:
        if version in _FLAGS_CACHE:
            return _FLAGS_CACHE[version]
        path = _cache_file(version)
        flags = None
        try:
            flags = {d["name"]: ServeFlag(d["name"], d["kind"], tuple(d["choices"]))
                     for d in json.loads(path.read_text())["flags"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if not flags:
            res = subprocess.run([*serve_command(), "serve", "--help"], capture_output=True, text=True,
                                 timeout=120, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
            flags = parse_serve_help(res.stdout)
            if res.returncode != 0 or "port" not in flags:
                raise ConfigError(f"cannot read the flags of `transformers serve` {version}: "
                                  f"{(res.stderr or res.stdout).strip()[-300:]}", key="backend")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"version": version, "flags": [f.to_dict() for f in flags.values()]}))
                os.replace(tmp, path)
            except OSError:
                pass  # cache is an optimisation
        _FLAGS_CACHE[version] = flags
        return flags


def tunable_flags(flags: Mapping[str, ServeFlag] | None = None) -> list[str]:
    flags = installed_flags() if flags is None else flags
    return sorted(n for n in flags if n not in LAUNCH_FLAGS)


def flag_args(values: Mapping[str, Any], flags: Mapping[str, ServeFlag] | None = None, *,
              where: str = "flags") -> list[str]:
    """Validate tuned values against the installed flags and render them as argv.

    ``None`` leaves the server default. Raises ConfigError naming the knob and the valid choices.
    """
    flags = installed_flags() if flags is None else flags
    valid = tunable_flags(flags)
    out: list[str] = []
    for name in sorted(values):
        value = values[name]
        if value is None:
            continue
        key = name.removeprefix("--").replace("_", "-")
        if key in LAUNCH_FLAGS:
            raise ConfigError(f"--{key} is set per launch by tuner, not a tuned flag", key=f"{where}.{name}")
        flag = flags.get(key)
        if flag is None:
            raise ConfigError(f"`transformers serve` {transformers_version()} has no flag --{key}; "
                              f"valid: {', '.join(valid)}", key=f"{where}.{name}")
        if flag.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"--{key} is a switch: give true or false, not {value!r}", key=f"{where}.{name}")
            out.append(f"--{key}" if value else f"--no-{key}")
            continue
        if flag.kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
                raise ConfigError(f"--{key} takes an integer, not {value!r}", key=f"{where}.{name}")
            value = int(value)
        elif flag.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"--{key} takes a number, not {value!r}", key=f"{where}.{name}")
        elif flag.kind == "choice" and str(value) not in flag.choices:
            raise ConfigError(f"--{key} must be one of {', '.join(flag.choices)}, not {value!r}",
                              key=f"{where}.{name}")
        out += [f"--{key}", str(value)]
    return out


# ------------------------------------------------------------------------------------------
# the model directory


def resolve_model_dir(study, options: Mapping[str, Any]) -> Path:
    """The study's ``model`` as a directory; relative paths are taken from the study's root
    (the folder above ``studies/``). With ``backend_options.make_tiny`` a missing directory is
    created by ``tuner.tinymodels.tiny`` (built aside and renamed: concurrent trials are safe)."""
    raw = user_path(str(study.model))
    if not raw.is_absolute():
        root = Path.cwd()
        if getattr(study, "source_path", None):
            src = Path(study.source_path).resolve().parent
            root = src.parent if src.name == "studies" else src
        raw = root / raw
    model_dir = raw.resolve()
    if (model_dir / "config.json").is_file():
        return model_dir
    spec_opts = options.get("make_tiny")
    if spec_opts is None:
        raise ConfigError(f"model directory {model_dir} has no config.json (the transformers engine serves a "
                          "local model dir; make one with `tuner model make-tiny DIR` or set "
                          "backend_options.make_tiny)", key="model")
    unknown = sorted(set(spec_opts) - set(spec_field_names()))
    if unknown:
        raise ConfigError(f"unknown field(s) {', '.join(unknown)}; valid: {', '.join(spec_field_names())}",
                          key="backend_options.make_tiny")
    tmp = model_dir.with_name(f".{model_dir.name}.{os.getpid()}.{time.monotonic_ns()}")
    make_tiny_model(tmp, TinyModelShape(**spec_opts), device=str(options.get("make_tiny_device", "cpu")))
    try:
        os.rename(tmp, model_dir)
    except OSError:  # another trial made it first
        shutil.rmtree(tmp, ignore_errors=True)
    if not (model_dir / "config.json").is_file():
        raise ConfigError(f"could not create {model_dir}", key="model")
    return model_dir


def model_facts(model_dir: Path) -> dict[str, Any]:
    """Vocabulary size (token ids the replay may draw) and whether the model is a tuner tiny model."""
    facts: dict[str, Any] = {"model_dir": str(model_dir)}
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
        facts["model_type"] = cfg.get("model_type")
        facts["vocab_size"] = int(cfg.get("vocab_size") or 32000)
    except (OSError, ValueError):
        facts["vocab_size"] = 32000
    tiny = model_dir / "tuner_model.json"
    if tiny.is_file():
        info = json.loads(tiny.read_text())
        facts["tiny_model"] = {k: info.get(k) for k in ("arch", "parameters", "weight_bytes")}
        facts["words"] = info.get("tokenizer", {}).get("words")
    return facts


# ------------------------------------------------------------------------------------------
# the backend


class TransformersBackend(ProcessBackend):
    kind = "transformers"

    def availability(self) -> tuple[bool, str]:
        version = transformers_version()
        if version is None:
            return False, "transformers is not installed (pip install 'transformers[serving]')"
        missing = [m for m in ("torch", "fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
        if missing:
            return False, f"transformers {version} is installed but serving needs {', '.join(missing)}"
        return True, f"transformers {version} with serving extras"

    @staticmethod
    def _options(request) -> dict[str, Any]:
        return dict(getattr(request.study, "backend_options", {}) or {})

    def _device(self, request) -> str:
        dev = request.flags.get("device")
        if dev is None:
            dev = "cpu" if str(request.study.hardware.gpu).lower() == "cpu" else "auto"
        return str(dev)

    def gpus_needed(self, request) -> int:
        return 0 if self._device(request) == "cpu" else 1

    def build_plan(self, request, trial_dir: Path) -> LaunchPlan:
        ok, why = self.availability()
        if not ok:
            raise BackendUnavailableError(why)
        options = self._options(request)
        flags = dict(request.flags)
        if str(request.study.hardware.gpu).lower() == "cpu":
            flags.setdefault("device", "cpu")
        argv_flags = flag_args(flags)
        if flags.get("device") == "cpu" and flags.get("continuous-batching") and \
                flags.get("cb-num-blocks") is None and flags.get("cb-max-memory-percent") is None:
            # on CPU the paged cache is sized from host RAM (and zero-filled): most of the machine
            raise TrialError(FailureClass.INFEASIBLE, "continuous batching on CPU needs cb-num-blocks or "
                             "cb-max-memory-percent, else its KV cache takes most of the host memory")
        model_dir = resolve_model_dir(request.study, options)
        facts = model_facts(model_dir)
        trial_dir = Path(trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        argv = [*serve_command(), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
                "--log-level", "info", *argv_flags]
        env: dict[str, str | None] = {
            "HF_HUB_OFFLINE": "1",  # never fetch: the model dir is all there is
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        if self._device(request) == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif request.gpu_ids:
            env.update(cuda_visible_devices(request.gpu_ids))
        if options.get("threads"):
            env["OMP_NUM_THREADS"] = str(int(options["threads"]))
        spec = ServerLaunch(
            name="transformers",
            argv=argv,
            port=port,
            log_path=str(trial_dir / "transformers-serve.log"),
            env=env,
            ready_paths=("/health",),
            startup_timeout_s=float(options.get("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S)),
        )
        facts.update(transformers_version=transformers_version(), flags=flags,
                     warmup_max_tokens=int(options.get("warmup_max_tokens", WARMUP_MAX_TOKENS)),
                     warmup_prompt_tokens=int(options.get("warmup_prompt_tokens", WARMUP_PROMPT_TOKENS)))
        (trial_dir / "launch.json").write_text(json.dumps({"argv": argv, "env": env}, indent=2) + "\n")
        plan = LaunchPlan(
            servers=[spec],
            api="completions",
            served_model=str(model_dir),  # the server is pinned to it: any other name is refused
            vocab_size=int(facts.get("words") or facts["vocab_size"]),
            send_ignore_eos=False,  # 422 "Unexpected fields" otherwise
            files={"launch": str(trial_dir / "launch.json")},
            prompt_format="text",  # the server refuses token-id prompts ("prompt must be a string")
            facts=facts,
        )
        return plan

    def server_facts(self, plan: LaunchPlan) -> dict[str, Any]:
        """Models the server lists, then one warm-up request whose token counts are checked."""
        base = plan.base_url
        facts: dict[str, Any] = {"models": try_get_json(base + "/v1/models", timeout_s=30)}
        n_in = int(plan.facts.get("warmup_prompt_tokens", WARMUP_PROMPT_TOKENS))
        n_out = int(plan.facts.get("warmup_max_tokens", WARMUP_MAX_TOKENS))
        warm = warmup(base, plan.served_model, n_in, n_out, exact=bool(plan.facts.get("tiny_model")),
                      log_path=plan.servers[0].log_path)
        facts["warmup"] = warm
        facts.update(read_cache_facts(plan.servers[0].log_path))
        facts["kv_capacity_tokens_total"] = None  # not reported by transformers serve
        return facts


# ------------------------------------------------------------------------------------------
# warm-up and log facts


def stream_completion(base_url: str, model: str | None, prompt: str, max_tokens: int,
                      timeout_s: float = 600.0) -> dict[str, Any]:
    """One streaming /v1/completions request: content chunks, usage, error, TTFT (seconds)."""
    body = {"prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0, "stream": True}
    if model is not None:
        body["model"] = model
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    out: dict[str, Any] = {"chunks": 0, "usage": None, "error": None, "ttft_s": None, "finish_reason": None}
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                obj = json.loads(payload)
                if "error" in obj:
                    out["error"] = str(obj["error"])[:500]
                    break
                choice = (obj.get("choices") or [{}])[0]
                if choice.get("text"):
                    out["chunks"] += 1
                    if out["ttft_s"] is None:
                        out["ttft_s"] = time.perf_counter() - t0
                if choice.get("finish_reason"):
                    out["finish_reason"] = choice["finish_reason"]
                if obj.get("usage"):
                    out["usage"] = obj["usage"]
    except urllib.error.HTTPError as exc:
        out["error"] = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["e2e_s"] = time.perf_counter() - t0
    return out


def warmup(base_url: str, model: str | None, prompt_tokens: int, max_tokens: int, *, exact: bool,
           log_path: str | None = None) -> dict[str, Any]:
    """Send the first (slow) request; raise TrialError if generation fails.

    With ``exact`` (a tuner tiny model: one token per word, unreachable EOS) the streamed chunks,
    the usage's completion tokens and its prompt tokens must equal what was asked for.
    """
    res = stream_completion(base_url, model, words_text(range(1, prompt_tokens + 1)), max_tokens)
    if res["error"] is not None or res["chunks"] == 0:
        raise TrialError("crash", f"warm-up request failed: {res['error'] or 'no tokens streamed'}",
                         log_path=log_path)
    usage = res["usage"] or {}
    res["tokens_exact"] = (res["chunks"] == max_tokens and usage.get("completion_tokens") == max_tokens
                           and usage.get("prompt_tokens") == prompt_tokens)
    if exact and not res["tokens_exact"]:
        raise TrialError("replay_invalid", f"warm-up asked {prompt_tokens} prompt / {max_tokens} output tokens, "
                         f"server streamed {res['chunks']} chunks with usage {usage}", log_path=log_path)
    log.info("warm-up: %d tokens, TTFT %.2f s, %.2f s total", res["chunks"], res["ttft_s"] or 0, res["e2e_s"])
    return res


_CACHE_RE = re.compile(r"Paged cache initialized: self\.max_batch_tokens = (\d+), self\.num_sectors = (\d+), "
                       r"mb_per_sector = (\d+)")
_MEM_RE = re.compile(r"Memory available for cache allocation: (\d+) MB")


def read_cache_facts(log_path: str) -> dict[str, Any]:
    """Continuous-batching cache sizes the server logged at its first request (info level)."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return {}
    facts: dict[str, Any] = {}
    m = _CACHE_RE.search(text)
    if m:
        facts["cb_max_batch_tokens"] = int(m.group(1))
        facts["cb_num_sectors"] = int(m.group(2))
        facts["cb_cache_mib"] = int(m.group(2)) * int(m.group(3))
    m = _MEM_RE.search(text)
    if m:
        facts["cb_memory_available_mib"] = int(m.group(1))
    return facts
