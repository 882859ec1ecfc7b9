"""Request routing over attention-DP ranks / DP replicas.

* ``round_robin`` (also SGLang's in-server ``--load-balance-method auto``), ``random``,
  ``power_of_two`` (two random ranks, the less loaded), ``total_requests`` / ``total_tokens``
  (least loaded);
* ``cache_aware``: sglang_router's policy. Load = in-flight requests per worker. If
  ``max - min > balance_abs`` and ``max > balance_rel * min`` the least-loaded worker wins.
  Otherwise the router's approximate tree (what it routed before, not what the worker still
  caches) gives each worker's matched prefix; the best match wins when matched / prompt >
  cache_threshold, else the least-loaded worker. Ties between equal matches go to the least
  loaded worker (UNVERIFIED tie-break, see docs/calibration.md). The router tree is never
  evicted here (sglang_router trims it to 2^26 characters every 60 s).

The router's tree is a ``PrefixIndex``: by session for the offline simulator, by content blocks
for ``tuner serve-sim``; both answer "how many leading tokens of this prompt did I route to worker
i before".
"""

from __future__ import annotations

import numpy as np

from tuner.errors import ConfigError

from tuner.vocabulary import RouterPolicy, names

# sglang_router's policies, then SGLang's in-server balancing methods (--load-balance-method)
POLICIES = (*names(RouterPolicy), "total_requests", "total_tokens")


def routing_policy(flags: dict, knobs: dict | None) -> str:
    """The policy a configuration routes with: tuner's ``router-policy`` knob (sglang_router in
    front of the workers) or else SGLang's in-server ``--load-balance-method`` (``auto`` is
    round robin)."""
    policy = (knobs or {}).get("router-policy")
    if policy:
        return str(policy)
    method = str(flags.get("load-balance-method") or "auto")
    return "round_robin" if method in ("auto", "round_robin", "follow_bootstrap_room") else method


class SessionIndex:
    """Router tree of the offline simulator: sessions share the system prefix, then diverge."""

    def __init__(self, n: int, system_prefix_tokens: int):
        self.sys_len = system_prefix_tokens
        self.tree: list[dict[int, int]] = [dict() for _ in range(n)]  # session -> routed prompt length
        self.seen = [False] * n

    def matched(self, i: int, req) -> int:
        m = self.tree[i].get(req.session, 0)
        if m == 0 and self.seen[i]:
            m = self.sys_len
        return min(m, req.input_len)

    def record(self, i: int, req) -> None:
        self.tree[i][req.session] = req.input_len
        self.seen[i] = True


class ContentIndex:
    """Router tree of ``tuner serve-sim``: the content blocks routed to each worker."""

    def __init__(self, n: int, block_tokens: int = 16):
        self.block = block_tokens
        self.tree: list[set[int]] = [set() for _ in range(n)]

    def matched(self, i: int, req) -> int:
        tree, n = self.tree[i], 0
        for h in req.route_chain:
            if h not in tree:
                break
            n += 1
        return n * self.block

    def record(self, i: int, req) -> None:
        self.tree[i].update(req.route_chain)


class Router:
    def __init__(self, policy: str, n: int, index, seed: int = 0, cache_threshold: float = 0.3,
                 balance_abs: int = 64, balance_rel: float = 1.5):
        if policy not in POLICIES:
            raise ConfigError(f"unknown routing policy {policy!r}; valid: {', '.join(POLICIES)}",
                              key="router-policy")
        self.policy, self.n, self.index = policy, n, index
        self.rng = np.random.default_rng([seed, 7])
        self.next = 0
        self.threshold, self.abs, self.rel = cache_threshold, balance_abs, balance_rel

    def route(self, req, loads: list[int], tokens: list[int]) -> int:
        n = self.n
        if n == 1:
            return 0
        p = self.policy
        if p == "round_robin":
            r = self.next
            self.next = (r + 1) % n
            return r
        if p == "random":
            return int(self.rng.integers(n))
        if p == "power_of_two":
            a, b = self.rng.choice(n, 2, replace=False)
            return int(a if loads[a] <= loads[b] else b)
        if p == "total_requests":
            return min(range(n), key=loads.__getitem__)
        if p == "total_tokens":
            return min(range(n), key=tokens.__getitem__)
        # cache_aware
        lo, hi = min(loads), max(loads)
        if hi - lo > self.abs and hi > self.rel * lo:
            r = loads.index(lo)
        else:
            best_len, best = -1, 0
            for i in range(n):
                matched = self.index.matched(i, req)
                if matched > best_len or (matched == best_len and loads[i] < loads[best]):
                    best_len, best = matched, i
            r = best if best_len / max(req.input_len, 1) > self.threshold else loads.index(lo)
        self.index.record(r, req)
        return r
