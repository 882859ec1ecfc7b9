"""Request routing over attention-DP ranks / DP replicas.

* ``round_robin`` (also SGLang's in-server ``--load-balance-method auto``), ``random``,
  ``power_of_two`` (two random ranks, the less loaded), ``total_requests`` / ``total_tokens``
  (least loaded);
* ``cache_aware``: sglang_router's policy. Load = in-flight requests per worker. If
  ``max - min > balance_abs`` and ``max > balance_rel * min`` the least-loaded worker wins.
  Otherwise the router's approximate tree (what it routed before, not what the worker still
  caches) gives each worker's matched prefix; the best match wins when matched / prompt >
  cache_threshold, else the least-loaded worker. Ties between equal matches go to the least
  loaded worker (UNVERIFIED tie-break, see docs/calibration.md).
"""

from __future__ import annotations

import numpy as np

from tuner.errors import ConfigError
from tuner.vocabulary import RouterPolicy, names

# sglang_router's policies, then SGLang's in-server balancing methods (--load-balance-method)
POLICIES = (*names(RouterPolicy), "total_requests", "total_tokens")


class Router:
    def __init__(self, policy: str, n: int, system_prefix_tokens: int, seed: int = 0,
                 cache_threshold: float = 0.3, balance_abs: int = 64, balance_rel: float = 1.5):
        if policy not in POLICIES:
            raise ConfigError(f"unknown routing policy {policy!r}; valid: {', '.join(POLICIES)}",
                              key="router-policy")
        self.policy, self.n = policy, n
        self.sys_len = system_prefix_tokens
        self.rng = np.random.default_rng([seed, 7])
        self.next = 0
        self.threshold, self.abs, self.rel = cache_threshold, balance_abs, balance_rel
        self.tree: list[dict[int, int]] = [dict() for _ in range(n)]  # session -> routed prompt length
        self.seen = [False] * n

    def route(self, session: int, prompt_len: int, loads: list[int], tokens: list[int]) -> int:
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
                matched = self.tree[i].get(session, 0)
                if matched == 0 and self.seen[i]:
                    matched = self.sys_len
                if matched > best_len or (matched == best_len and loads[i] < loads[best]):
                    best_len, best = matched, i
            r = best if best_len / max(prompt_len, 1) > self.threshold else loads.index(lo)
        self.tree[r][session] = prompt_len
        self.seen[r] = True
        return r
