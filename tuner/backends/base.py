"""What a process backend (SGLang, ``transformers serve``) provides to the live evaluator.

A backend is pure planning: from a trial it builds a ``LaunchPlan`` (argv, environment, ports,
ready paths and files for each process) and afterwards reads server facts over HTTP. Starting,
watching and stopping processes is ``tuner.backends.process``; measuring is
``tuner.evaluation.live.LiveEvaluator``, which drives any ``ProcessBackend``:

    plan = backend.build_plan(request, trial_dir)     # writes config files under trial_dir
    stack = ProcessStack(); for spec in plan.servers: stack.start(spec)   # waits until ready
    if plan.router: stack.start(plan.router)
    facts = backend.server_facts(plan)                # e.g. KV capacity from /server_info
    run_load_point(plan.base_url, ..., api=plan.api, model=plan.served_model)

Backends never import the server package they launch (SGLang pins its own torch): they only build
argv lists, so everything but the real launch works without it installed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.backends.process import ServerLaunch


@dataclass
class LaunchPlan:
    """Everything needed to start one trial's processes, in start order.

    ``servers`` are started first (each waited until ready), then ``router`` (if any) in front of
    them; the load goes to ``base_url`` (the router's when there is one). ``files`` names what the
    plan wrote (config YAML, MoE config dir), for the trial record.
    """

    servers: list[ServerLaunch]
    router: ServerLaunch | None = None
    api: str = "completions"  # replay API: "completions" or "chat"
    served_model: str | None = None  # "model" field of requests (None: server default)
    vocab_size: int = 32000  # token ids the replay may draw
    send_ignore_eos: bool = True  # server honours ignore_eos (fixed output lengths)
    prompt_format: str = "ids"  # replay prompts as token ids or as text ("text": server takes strings only)
    use_server_output_ids: bool = False  # next turns resend the ids the server generated (/generate)
    files: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # what the plan decided (gpus, ranks, ...)

    @property
    def base_url(self) -> str:
        front = self.router if self.router is not None else self.servers[0]
        return front.base_url

    @property
    def all_specs(self) -> list[ServerLaunch]:
        return [*self.servers, *([self.router] if self.router else [])]


class ProcessBackend(ABC):
    """A server kind tuner can launch as OS processes."""

    #: registry name, also recorded with every measurement
    kind: str = "base"

    @abstractmethod
    def availability(self) -> tuple[bool, str]:
        """(usable here, one-line reason): the server package is installed, etc."""

    @abstractmethod
    def gpus_needed(self, request) -> int:
        """GPUs the trial occupies (world size)."""

    @abstractmethod
    def build_plan(self, request, trial_dir: Path) -> LaunchPlan:
        """Validate the configuration (ConfigError / TrialError('infeasible')), choose free ports,
        write any per-trial files under ``trial_dir`` and return the processes to start."""

    def server_facts(self, plan: LaunchPlan) -> dict[str, Any]:
        """Facts read from the ready server(s). Key ``kv_capacity_tokens_total`` (int | None)
        is used as the deployment's measured KV capacity. Default: nothing."""
        return {}

    def metrics_urls(self, plan: LaunchPlan) -> list[str]:
        """Prometheus endpoints read before and after each load point (default: none)."""
        return []

    def startup_failure_detail(self, log_text: str) -> str:
        """A phrase saying where in start-up a server died, from its log (default: nothing)."""
        return ""

    def kernel_cache_state(self, plan: LaunchPlan) -> dict[str, Any] | None:
        """What the servers' on-disk kernel cache holds before they start (a server whose kernels
        are cached skips their first-use compiles); None where the backend keeps none."""
        return None

    def kernel_cache_dir(self, plan: LaunchPlan) -> Path | None:
        """The one kernel-cache directory the plan's servers share, where it is fixed (a later
        server finds there what earlier ones built); None where the backend keeps none."""
        return None

    def kernel_set(self, plan: LaunchPlan) -> dict[str, Any] | None:
        """What decides the binaries of the kernels the plan's servers build (servers with equal
        sets share cached builds: ``tuner.evaluation.kernel_ledger``); None where none are cached."""
        return None


def http_get_json(url: str, timeout_s: float = 30.0) -> Any:
    """GET ``url`` and decode JSON; raises OSError / ValueError on failure."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read().decode())


def try_get_json(url: str, timeout_s: float = 30.0) -> Any | None:
    try:
        return http_get_json(url, timeout_s)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def cuda_visible_devices(gpu_ids) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for the GPUs Ray assigned a trial (empty when there are none)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpu_ids)} if gpu_ids else {}
