"""The normalized trace every importer produces, and its summary statistics.

A trace is a list of requests. Each request knows its session and turn (where the source says or
lets us infer them), its arrival time, its input/output lengths and, where the source has them,
the hashes of its prompt's fixed-size blocks (so shared prefixes are visible).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TraceRequest:
    session_id: str
    turn: int
    input_tokens: int
    output_tokens: int
    timestamp_s: float | None = None  # arrival, seconds from the trace's start
    think_time_s: float | None = None  # pause before this request (after the previous response)
    hash_ids: tuple[int, ...] | None = None  # one hash per block_size tokens of the prompt
    prefix_hit_tokens: int | None = None  # reusable prefix the source itself reports
    agent: str | None = None  # e.g. "main" / "main.sa1" in Claude Code traces


@dataclass
class Trace:
    requests: list[TraceRequest]
    format: str
    source: str
    block_size: int | None = None  # tokens per hash id
    system_prefix_tokens: int | None = None  # shared system + tool prompt, where the source says
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)

    def sessions(self) -> dict[str, list[TraceRequest]]:
        """Requests grouped by session, each sorted by turn (insertion order of sessions)."""
        out: dict[str, list[TraceRequest]] = defaultdict(list)
        for r in self.requests:
            out[r.session_id].append(r)
        for reqs in out.values():
            reqs.sort(key=lambda r: r.turn)
        return dict(out)


def _summary(values, keys=("mean", "median", "p90", "p99")) -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {k: None for k in keys}
    stats = {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }
    return {k: stats[k] for k in keys}


class _BlockTrie:
    """Radix tree over block hashes: an unlimited prefix cache."""

    def __init__(self):
        self.root: dict = {}

    def match_and_insert(self, hashes) -> int:
        node, matched, inserting = self.root, 0, False
        for h in hashes:
            child = None if inserting else node.get(h)
            if child is None:
                inserting = True
                child = node[h] = {}
            else:
                matched += 1
            node = child
        return matched


def reusable_prefix_tokens(trace: Trace) -> tuple[list[int], str] | tuple[None, str]:
    """Per request, input tokens an unlimited prefix cache would already hold; and the method.

    Hash-based where the source has block hashes (exact up to a block), else the source's own
    prefix-hit figure, else the conversation model (a turn re-sends the previous prompt and
    response). Traces without sessions or hashes have no prefix information: (None, "none").
    """
    reqs = trace.requests
    if trace.block_size and any(r.hash_ids for r in reqs):
        # Per-session hash scopes are kept apart by keying the trie on the scope.
        tries: dict[str, _BlockTrie] = defaultdict(_BlockTrie)
        local = trace.format in ("kvcache-tester",)
        out = []
        for r in sorted(reqs, key=lambda r: (r.timestamp_s or 0.0)):
            trie = tries[r.session_id.split("/")[0] if local else ""]
            blocks = trie.match_and_insert(r.hash_ids or ())
            out.append((id(r), min(r.input_tokens, blocks * trace.block_size)))
        by_id = dict(out)
        return [by_id[id(r)] for r in reqs], "block_hashes"
    if any(r.prefix_hit_tokens is not None for r in reqs):
        return [min(r.input_tokens, r.prefix_hit_tokens or 0) for r in reqs], "source_prefix_hits"
    sessions = trace.sessions()
    if all(len(s) == 1 for s in sessions.values()) and not trace.system_prefix_tokens:
        return None, "none"
    reuse: dict[int, int] = {}
    shared_seen = False
    for reqs_s in sessions.values():
        prev = None
        for r in reqs_s:
            if prev is None:
                hit = min(r.input_tokens, trace.system_prefix_tokens or 0) if shared_seen else 0
                shared_seen = shared_seen or bool(trace.system_prefix_tokens)
            else:
                hit = min(r.input_tokens, prev.input_tokens + prev.output_tokens)
            reuse[id(r)] = hit
            prev = r
    return [reuse[id(r)] for r in reqs], "conversation"


def trace_stats(trace: Trace) -> dict:
    """The `tuner workload stats --json` document."""
    reqs = trace.requests
    sessions = trace.sessions()
    reuse, method = reusable_prefix_tokens(trace)
    total_in = sum(r.input_tokens for r in reqs)
    ratio = None if reuse is None or total_in == 0 else sum(reuse) / total_in
    times = [r.timestamp_s for r in reqs if r.timestamp_s is not None]
    turns = [len(s) for s in sessions.values()]
    return {
        "source": trace.source,
        "format": trace.format,
        "requests": len(reqs),
        "sessions": len(sessions),
        "input_tokens": _summary([r.input_tokens for r in reqs]),
        "output_tokens": _summary([r.output_tokens for r in reqs]),
        "turns_per_session": _summary(turns, keys=("mean", "median", "max")),
        "prefix_reuse_ratio": ratio,
        "prefix_reuse_method": method,
        "duration_s": (max(times) - min(times)) if times else None,
        "skipped_lines": trace.skipped_lines,
        "notes": list(trace.notes),
    }
