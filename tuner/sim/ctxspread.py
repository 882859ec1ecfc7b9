"""How the contexts of requests that decode together spread around their mean.

SGLang's step log gives a decode batch's request count and its total KV tokens, not each request's
context, but its Triton decode kernel waits for the longest request (``StepTimeModel.
decode_attention_time``). The step-time fit therefore estimates a logged batch's longest and
shortest context from the workload that produced it: ``n`` requests drawn as a server holds them
(each turn for as long as it decodes, so in proportion to its output), the expected longest and
shortest over the expected mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tuner.workload.session import WorkloadProfile, generate_session

SPREAD_SESSIONS = 400  # sessions drawn from the workload (its turns are the population)
SPREAD_DRAWS = 200  # batches drawn at each size
SPREAD_MAX_BATCH = 256  # batch sizes beyond this reuse the last ratio


@dataclass(frozen=True)
class ContextSpread:
    """Expected longest / mean and shortest / mean context of a decode batch, by its size."""

    hi: tuple[float, ...]  # index n-1: a batch of n requests
    lo: tuple[float, ...]

    def extremes(self, batch: int, ctx_tokens: int) -> tuple[int, int]:
        """Longest and shortest context of ``batch`` requests holding ``ctx_tokens`` in all."""
        if batch <= 0 or ctx_tokens <= 0:
            return 0, 0
        i = min(batch, len(self.hi)) - 1
        mean = ctx_tokens / batch
        return int(round(mean * self.hi[i])), max(1, int(round(mean * self.lo[i])))


def decode_contexts(profile: WorkloadProfile, sessions: int = SPREAD_SESSIONS,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each turn's context halfway through its output, and its output tokens (its weight)."""
    ctx, weight = [], []
    for i in range(sessions):
        s = generate_session(profile, i, seed)
        for k, turn in enumerate(s.turns):
            ctx.append(s.prompt_tokens(k) + turn.output_tokens / 2)
            weight.append(turn.output_tokens)
    return np.asarray(ctx, dtype=float), np.asarray(weight, dtype=float)


def spread_from_contexts(ctx: np.ndarray, weight: np.ndarray, max_batch: int = SPREAD_MAX_BATCH,
                         draws: int = SPREAD_DRAWS, seed: int = 0) -> ContextSpread:
    if ctx.size == 0:
        raise ValueError("no decode contexts to draw from")
    rng = np.random.default_rng(seed)
    p = weight / weight.sum()
    hi, lo = [], []
    for n in range(1, max_batch + 1):
        batch = ctx[rng.choice(ctx.size, size=(draws, n), p=p)]
        mean = batch.mean()
        hi.append(float(batch.max(axis=1).mean() / mean))
        lo.append(float(batch.min(axis=1).mean() / mean))
    return ContextSpread(tuple(hi), tuple(lo))


@lru_cache(maxsize=32)
def _spread_of(profile_json: str) -> ContextSpread:
    profile = WorkloadProfile.model_validate_json(profile_json)
    return spread_from_contexts(*decode_contexts(profile))


def context_spread(profile: WorkloadProfile) -> ContextSpread:
    """The spread of ``profile``'s decode batches (computed once per profile)."""
    return _spread_of(profile.model_dump_json())
