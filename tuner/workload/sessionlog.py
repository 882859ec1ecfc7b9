"""tuner's JSONL session log: one request per line (the `jsonl` trace format, docs/workload.md)."""

from __future__ import annotations

import json
from tuner import safewrite
from tuner.workload.session import WorkloadProfile, generate_sessions


def session_log_records(profile: WorkloadProfile, sessions: int, seed: int = 0):
    """The requests of ``sessions`` generated sessions, with arrival times of one user each."""
    for s in generate_sessions(profile, sessions, seed):
        t = 0.0
        for k, turn in enumerate(s.turns):
            think = s.turns[k - 1].think_time_s if k else None
            if think is not None:
                t += think
            yield {
                "session_id": s.session_id,
                "turn": k,
                "input_tokens": s.prompt_tokens(k),
                "output_tokens": turn.output_tokens,
                "think_time_s": think,
                "timestamp_s": round(t, 3),
                "system_prefix_tokens": s.system_prefix_tokens,
            }


def write_session_log(profile: WorkloadProfile, path, sessions: int, seed: int = 0) -> int:
    n = 0
    with safewrite.atomic_open(path) as f:  # whole or not at all; never through a link or to a device
        for rec in session_log_records(profile, sessions, seed):
            f.write(json.dumps({k: v for k, v in rec.items() if v is not None}) + "\n")
            n += 1
    return n
