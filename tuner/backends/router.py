"""``sglang_router`` in front of several SGLang workers (replicas or attention-DP ranks).

* ``dp-size`` N > 1 with a ``router-policy``: N single-replica servers (each on its own TP GPUs)
  behind ``python -m sglang_router.launch_router --worker-urls U1 .. UN --policy P``.
* ``attn-dp-size`` > 1 with a ``router-policy``: one server; the router gets ``--dp-aware`` so it
  routes to the individual attention-DP ranks inside it.
* No policy: no router; SGLang balances internally (``--load-balance-method``).

The router is started after the workers are ready and stopped first (ProcessStack order).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Sequence

from tuner.errors import ConfigError
from tuner.vocabulary import RouterPolicy, names

ROUTER_POLICIES = names(RouterPolicy)


@dataclass(frozen=True)
class Topology:
    """How a configuration is laid out as processes."""

    tp_size: int
    dp_size: int  # full model replicas
    attn_dp_size: int  # attention-DP ranks inside one replica
    router_policy: str | None
    replicas_as_processes: int  # separate server processes (dp when a router fronts them, else 1)
    dp_aware: bool  # router addresses attention-DP ranks
    note: str = ""

    @property
    def world_size(self) -> int:
        return self.tp_size * self.dp_size

    @property
    def uses_router(self) -> bool:
        return self.router_policy is not None and (self.replicas_as_processes > 1 or self.dp_aware)


def plan_topology(flags: dict, knobs: dict) -> Topology:
    """Decide processes and routing from ``tp-size``, ``dp-size``, ``attn-dp-size`` and the knob."""
    tp = int(flags.get("tp-size") or 1)
    dp = int(flags.get("dp-size") or 1)
    adp = int(flags.get("attn-dp-size") or 1)
    policy = knobs.get("router-policy")
    if policy in ("none", "None", ""):
        policy = None
    if policy is not None and policy not in ROUTER_POLICIES:
        raise ConfigError(f"unknown router policy {policy!r}; valid: None, {', '.join(ROUTER_POLICIES)}",
                          key="knobs.router-policy")
    if policy is None:
        return Topology(tp, dp, adp, None, 1, False)
    if dp > 1:
        return Topology(tp, dp, adp, policy, dp, False)
    if adp > 1:
        return Topology(tp, dp, adp, policy, 1, True)
    return Topology(tp, dp, adp, None, 1, False, note=f"router-policy {policy} ignored: a single worker")


def router_argv(worker_urls: Sequence[str], policy: str, host: str, port: int, *, dp_aware: bool = False,
                python: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``python -m sglang_router.launch_router ...`` as an argv list."""
    if policy not in ROUTER_POLICIES:
        raise ConfigError(f"unknown router policy {policy!r}; valid: {', '.join(ROUTER_POLICIES)}",
                          key="knobs.router-policy")
    if not worker_urls:
        raise ValueError("router needs at least one worker URL")
    argv = [python or sys.executable, "-m", "sglang_router.launch_router",
            "--worker-urls", *worker_urls, "--policy", policy, "--host", host, "--port", str(port)]
    if dp_aware:
        argv.append("--dp-aware")
    argv.extend(extra)
    return argv
