"""Fit a WorkloadProfile's lognormals to a trace.

Each quantity gets the maximum-likelihood lognormal (mu, sigma = mean and population standard
deviation of ln x), clipped to the observed [min, max] (think time to [min, p99] so one user who
left for a day does not stall a replay). The KS statistic says how well each fit matches; the
per-turn input length the fitted session model produces is compared with the data's, because
that is what a server sees and what the separate fits do not check on their own.

How a trace becomes samples (see docs/workload.md):
  first_turn_context_tokens  turn-0 input minus the shared system prefix
  new_tokens_per_turn        input_k - input_{k-1} - output_{k-1} on turns that re-send the
                             previous prompt; turns whose previous prompt was not reused (the
                             context was compacted or rewritten) are left out and counted as
                             context resets, and so are turns where that difference is <= 0 (the
                             previous response was not kept whole in the context)
  output_tokens_per_turn     output of every turn (zeros left out)
  turns_per_session          requests per session
  think_time_s               the pause before every turn after the first (zeros left out)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from tuner.errors import ConfigError
from tuner.workload.session import LogNormal, WorkloadProfile, generate_session
from tuner.workload.trace import Trace, TraceRequest
from pydantic import ValidationError

FIELDS = ("first_turn_context_tokens", "new_tokens_per_turn", "output_tokens_per_turn", "turns_per_session", "think_time_s")
_PLACEHOLDER = LogNormal(mu=0.0, sigma=0.0)  # for a quantity the trace has no sample of


@dataclass
class LogNormalFit:
    dist: LogNormal
    n: int  # samples used
    excluded: int  # samples left out (non-positive)
    ks_statistic: float | None
    fitted: bool = True

    def to_dict(self) -> dict:
        return {"mu": self.dist.mu, "sigma": self.dist.sigma, "min": self.dist.min, "max": self.dist.max,
                "median": self.dist.median, "n": self.n, "excluded": self.excluded,
                "ks_statistic": self.ks_statistic, "fitted": self.fitted}


def fit_lognormal(values, *, clip_max_percentile: float | None = None) -> LogNormalFit:
    """MLE lognormal of the positive ``values``; non-positive ones are counted as excluded."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    pos = x[x > 0]
    excluded = int(x.size - pos.size)
    if pos.size == 0:
        return LogNormalFit(_PLACEHOLDER, 0, excluded, None, fitted=False)
    logs = np.log(pos)
    mu, sigma = float(logs.mean()), float(logs.std())
    hi = float(np.percentile(pos, clip_max_percentile)) if clip_max_percentile else float(pos.max())
    dist = LogNormal(mu=round(mu, 4), sigma=round(sigma, 4), min=round(float(pos.min()), 3), max=round(hi, 3))
    ks = None
    if pos.size >= 2 and sigma > 0:
        ks = float(stats.kstest(pos, "lognorm", args=(sigma, 0, np.exp(mu))).statistic)
    return LogNormalFit(dist, int(pos.size), excluded, ks)


@dataclass
class SessionSamples:
    first_turn_context_tokens: list[int] = field(default_factory=list)
    new_tokens_per_turn: list[int] = field(default_factory=list)
    output_tokens_per_turn: list[int] = field(default_factory=list)
    turns_per_session: list[int] = field(default_factory=list)
    think_time_s: list[float] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)  # every request's prompt, for comparison
    context_resets: int = 0
    shrinking_turns: int = 0  # re-sent prefix but input grew by less than the previous output
    sessions: int = 0
    excluded_sessions: int = 0


def _previous_prompt_reused(prev: TraceRequest, cur: TraceRequest, block_size: int | None) -> bool:
    if cur.prefix_hit_tokens is not None:
        return cur.prefix_hit_tokens >= prev.input_tokens - (block_size or 64)
    if prev.hash_ids is not None and cur.hash_ids is not None:
        full = prev.input_tokens // block_size if block_size else len(prev.hash_ids)
        return tuple(cur.hash_ids[:full]) == tuple(prev.hash_ids[:full])
    return cur.input_tokens >= prev.input_tokens  # no prefix information: assume re-sent if it grew


def session_samples(trace: Trace, *, system_prefix_tokens: int = 0, include_subagents: bool = False) -> SessionSamples:
    out = SessionSamples()
    for reqs in trace.sessions().values():
        if not include_subagents and reqs[0].agent not in (None, "main"):
            out.excluded_sessions += 1
            continue
        out.sessions += 1
        out.turns_per_session.append(len(reqs))
        out.first_turn_context_tokens.append(reqs[0].input_tokens - system_prefix_tokens)
        prev = None
        for r in reqs:
            out.input_tokens.append(r.input_tokens)
            out.output_tokens_per_turn.append(r.output_tokens)
            if prev is not None:
                think = r.think_time_s
                if think is None and r.timestamp_s is not None and prev.timestamp_s is not None:
                    think = r.timestamp_s - prev.timestamp_s  # response time unknown: an upper bound
                if think is not None:
                    out.think_time_s.append(think)
                if not _previous_prompt_reused(prev, r, trace.block_size):
                    out.context_resets += 1
                else:
                    new = r.input_tokens - prev.input_tokens - prev.output_tokens
                    if new > 0:
                        out.new_tokens_per_turn.append(new)
                    else:
                        out.shrinking_turns += 1
            prev = r
    return out


def _pcts(values) -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {}
    return {f"p{q}": float(np.percentile(a, q)) for q in (10, 50, 90, 99)} | {"mean": float(a.mean())}


def model_input_tokens(profile: WorkloadProfile, sessions: int, seed: int = 0) -> list[int]:
    """Every turn's prompt length in ``sessions`` sessions drawn from ``profile``."""
    out = []
    for i in range(sessions):
        s = generate_session(profile, i, seed)
        out.extend(s.prompt_tokens(k) for k in range(s.num_turns))
    return out


_MAX_CONTEXT_PERCENTILES = (75, 80, 85, 90, 95, 97.5, 99, 100)


def _input_ks(profile: WorkloadProfile, data, sessions: int, seed: int) -> float:
    model = model_input_tokens(profile, sessions, seed)
    return float(stats.ks_2samp(model, data).statistic) if model else 1.0


def fit_trace(trace: Trace, **kwargs) -> tuple[WorkloadProfile, dict]:
    """A profile fitted to ``trace`` and the report (fits, KS, model-vs-data input percentiles).

    A trace whose values lie beyond what a profile may hold (tuner.limits: e.g. a turn of 10^13
    tokens) is a ConfigError naming the trace and the quantity, not a failed validation."""

    try:
        return _fit_trace(trace, **kwargs)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"the fitted {key} is outside what a workload profile may hold: "
                          f"{err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r:.60}); "
                          "check the trace for absurd values", file=trace.source) from None


def _fit_trace(
    trace: Trace,
    *,
    name: str = "fitted",
    system_prefix_tokens: int | None = None,
    include_subagents: bool = False,
    max_context_tokens: int | None = None,
    model_sessions: int = 2000,
    seed: int = 0,
) -> tuple[WorkloadProfile, dict]:
    prefix = system_prefix_tokens if system_prefix_tokens is not None else (trace.system_prefix_tokens or 0)
    samples = session_samples(trace, system_prefix_tokens=prefix, include_subagents=include_subagents)
    if samples.sessions == 0:
        raise ConfigError("no sessions left to fit (all were sub-agents? try --include-subagents)", file=trace.source)
    fits = {
        "first_turn_context_tokens": fit_lognormal(samples.first_turn_context_tokens),
        "new_tokens_per_turn": fit_lognormal(samples.new_tokens_per_turn),
        "output_tokens_per_turn": fit_lognormal(samples.output_tokens_per_turn),
        "turns_per_session": fit_lognormal(samples.turns_per_session),
        "think_time_s": fit_lognormal(samples.think_time_s, clip_max_percentile=99),
    }
    if not fits["first_turn_context_tokens"].fitted or not fits["output_tokens_per_turn"].fitted:
        raise ConfigError("trace has no positive input/output lengths to fit", file=trace.source)
    if not fits["new_tokens_per_turn"].fitted:  # single-turn trace: later turns never happen
        fits["new_tokens_per_turn"] = LogNormalFit(fits["first_turn_context_tokens"].dist, 0, 0, None, fitted=False)
    def make(max_ctx: int) -> WorkloadProfile:
        return WorkloadProfile(
            name=name,
            description=f"Fitted to {trace.source} ({trace.format}, {samples.sessions} sessions).",
            system_prefix_tokens=prefix,
            first_turn_context_tokens=fits["first_turn_context_tokens"].dist,
            new_tokens_per_turn=fits["new_tokens_per_turn"].dist,
            output_tokens_per_turn=fits["output_tokens_per_turn"].dist,
            turns_per_session=fits["turns_per_session"].dist,
            think_time_s=fits["think_time_s"].dist,
            max_context_tokens=max_ctx,
        )

    if max_context_tokens is None:
        # Real agents stop growing a context at their window or compact it; the model stands for
        # that with a session-ending limit, chosen among the data's input percentiles to best
        # match the per-turn input distribution.
        cands = sorted({int(np.percentile(samples.input_tokens, q)) + 1 for q in _MAX_CONTEXT_PERCENTILES})
        scored = [(_input_ks(make(c), samples.input_tokens, min(model_sessions, 500), seed), c) for c in cands]
        max_context_tokens = min(scored)[1]
    profile = make(int(max_context_tokens))
    max_ctx = profile.max_context_tokens
    model = model_input_tokens(profile, model_sessions, seed)
    ks_input = float(stats.ks_2samp(model, samples.input_tokens).statistic) if model else None
    report = {
        "source": trace.source,
        "format": trace.format,
        "sessions": samples.sessions,
        "excluded_subagent_sessions": samples.excluded_sessions,
        "requests": len(samples.input_tokens),
        "system_prefix_tokens": prefix,
        "context_resets": samples.context_resets,
        "shrinking_turns": samples.shrinking_turns,
        "fits": {k: v.to_dict() for k, v in fits.items()},
        "input_tokens_per_turn": {
            "data": _pcts(samples.input_tokens),
            "model": _pcts(model),
            "ks_statistic": ks_input,
            "model_sessions": model_sessions,
            "max_context_tokens": max_ctx,
        },
        "notes": list(trace.notes),
    }
    return profile, report
