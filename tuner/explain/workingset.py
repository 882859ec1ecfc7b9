"""The KV working set of a workload: the tokens closed-loop users' live conversations hold.

Each user holds one conversation at a time; between turns (while it thinks) its context stays
worth keeping, so the working set at U users is U times the mean conversation length at a turn
(prompt plus output, averaged over the turns of the workload's sessions), plus the shared system
prefix once. The mean comes from the workload's own deterministic sessions.
"""

from __future__ import annotations

from functools import lru_cache

from tuner.workload.session import WorkloadProfile, generate_session

SAMPLE_SESSIONS = 600


@lru_cache(maxsize=64)
def _turn_stats(profile_json: str) -> tuple[float, float, int]:
    profile = WorkloadProfile.model_validate_json(profile_json)
    context = reusable = prompt = 0.0
    turns = 0
    prefix = 0
    for i in range(SAMPLE_SESSIONS):
        s = generate_session(profile, i, 0)
        prefix = s.system_prefix_tokens
        for k in range(s.num_turns):
            p = s.prompt_tokens(k)
            context += p + s.turns[k].output_tokens
            reusable += s.reusable_prefix_tokens(k)
            prompt += p
            turns += 1
    return context / max(1, turns), reusable / max(1.0, prompt), prefix


def mean_context_tokens(profile: WorkloadProfile) -> float:
    """Mean conversation length (prompt + output) at a turn."""
    return _turn_stats(profile.model_dump_json())[0]


def ideal_hit_rate(profile: WorkloadProfile) -> float:
    """The prefix hit rate an unlimited cache would reach: re-sent tokens over prompt tokens."""
    return _turn_stats(profile.model_dump_json())[1]


def working_set_tokens(profile: WorkloadProfile, users: int) -> float:
    ctx, _, prefix = _turn_stats(profile.model_dump_json())
    return users * max(0.0, ctx - prefix) + prefix
