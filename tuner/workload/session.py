"""Multi-turn session model shared by the replay client and the simulator.

A session is a list of turns. Turn k's prompt is turn k-1's prompt + turn k-1's output + the new
tokens of turn k (tool results, the user's message). Every session starts with the workload's
shared system/tool prefix, so the prefix is a real shared prefix for a server's radix cache.
Lengths are drawn from lognormals (mu, sigma of ln x) with a fixed seed: two runs with the same
profile and seed produce identical sessions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class LogNormal(BaseModel):
    """A lognormal distribution: ln(x) ~ Normal(mu, sigma), optionally clipped to [min, max]."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mu: float
    sigma: float = Field(ge=0)
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check_bounds(self):
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        return self

    @property
    def median(self) -> float:
        return float(np.exp(self.mu))

    @property
    def mean(self) -> float:
        return float(np.exp(self.mu + self.sigma**2 / 2))

    def sample(self, rng: np.random.Generator, size: int | None = None):
        x = rng.lognormal(self.mu, self.sigma, size=size)
        if self.min is not None or self.max is not None:
            x = np.clip(x, self.min if self.min is not None else -np.inf,
                        self.max if self.max is not None else np.inf)
        return x


class WorkloadProfile(BaseModel):
    """Parameters of a multi-turn agent workload (the `workload:` section of a study or a
    workloads/*.yaml file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = "custom"
    description: str = ""
    system_prefix_tokens: int = Field(default=4000, ge=0, description="shared system + tool prompt")
    first_turn_context_tokens: LogNormal  # unique context of turn 0 (task, files)
    new_tokens_per_turn: LogNormal  # tool results / user message appended each later turn
    output_tokens_per_turn: LogNormal
    turns_per_session: LogNormal
    think_time_s: LogNormal  # pause between a response and the next turn (tool run, user)
    max_context_tokens: int = Field(default=131072, gt=0, description="a session ends before its prompt would exceed this")
    scale: float = Field(default=1.0, gt=0, description="multiplies every token length (to fit shorter context windows)")


@dataclass(frozen=True)
class Turn:
    new_tokens: int  # tokens appended before this turn (turn 0: first-turn context)
    output_tokens: int
    think_time_s: float  # pause after this turn's response before the next turn

@dataclass(frozen=True)
class Session:
    session_id: int
    system_prefix_tokens: int
    turns: tuple[Turn, ...]

    def prompt_tokens(self, turn: int) -> int:
        """Length of the prompt sent at ``turn`` (whole conversation so far)."""
        total = self.system_prefix_tokens
        for k in range(turn + 1):
            total += self.turns[k].new_tokens
            if k < turn:
                total += self.turns[k].output_tokens
        return total

    @property
    def num_turns(self) -> int:
        return len(self.turns)


def generate_sessions(profile: WorkloadProfile, count: int, seed: int = 0) -> list[Session]:
    """``count`` sessions drawn from ``profile``; deterministic in (profile, count, seed).

    Session i depends only on (seed, i), so the first N sessions are the same whatever ``count``.
    """
    out = []
    for i in range(count):
        rng = np.random.default_rng([seed, i])
        n_turns = max(1, int(round(float(profile.turns_per_session.sample(rng)))))
        prefix = int(round(profile.system_prefix_tokens * profile.scale))
        context = prefix
        turns: list[Turn] = []
        for k in range(n_turns):
            dist = profile.first_turn_context_tokens if k == 0 else profile.new_tokens_per_turn
            new = max(1, int(round(float(dist.sample(rng)) * profile.scale)))
            out_tok = max(1, int(round(float(profile.output_tokens_per_turn.sample(rng)) * profile.scale)))
            think = float(profile.think_time_s.sample(rng))
            if k > 0 and context + new + out_tok > profile.max_context_tokens:
                break
            if k == 0 and context + new + out_tok > profile.max_context_tokens:
                new = max(1, profile.max_context_tokens - context - out_tok)
            turns.append(Turn(new_tokens=new, output_tokens=out_tok, think_time_s=think))
            context += new + out_tok
        out.append(Session(session_id=i, system_prefix_tokens=prefix, turns=tuple(turns)))
    return out
