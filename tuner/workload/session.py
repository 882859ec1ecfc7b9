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

from tuner import limits as L


Mu = L.number(float, -L.MAX_LOGNORMAL_MU, L.MAX_LOGNORMAL_MU, description="mean of ln x")
Sigma = L.number(float, 0, L.MAX_LOGNORMAL_SIGMA, description="standard deviation of ln x")
Bound = L.number(float, 0, L.MAX_LOGNORMAL_BOUND)
Tokens = L.number(int, 0, L.MAX_TOKENS, unit="tokens")
ContextTokens = L.number(int, 1, L.MAX_TOKENS, unit="tokens",
                         description="a session ends before its prompt would exceed this")
Scale = L.number(float, 0, L.MAX_WORKLOAD_SCALE, lo_open=True,
                 description="multiplies every token length (to fit shorter context windows)")


class LogNormal(BaseModel):
    """A lognormal distribution: ln(x) ~ Normal(mu, sigma), optionally clipped to [min, max]."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    mu: Mu
    sigma: Sigma
    min: Bound | None = None
    max: Bound | None = None

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
        if size is None:  # one draw: plain comparisons (np.clip on a scalar costs most of a session's generation)
            if self.min is not None and x < self.min:
                x = float(self.min)
            if self.max is not None and x > self.max:
                x = float(self.max)
            return x
        if self.min is not None or self.max is not None:
            x = np.clip(x, self.min if self.min is not None else -np.inf,
                        self.max if self.max is not None else np.inf)
        return x


class WorkloadProfile(BaseModel):
    """Parameters of a multi-turn agent workload (the `workload:` section of a study or a
    workloads/*.yaml file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: L.Name = "custom"
    description: L.Text = ""
    system_prefix_tokens: Tokens = Field(default=4000, description="shared system + tool prompt")
    first_turn_context_tokens: LogNormal  # unique context of turn 0 (task, files)
    new_tokens_per_turn: LogNormal  # tool results / user message appended each later turn
    output_tokens_per_turn: LogNormal
    turns_per_session: LogNormal
    think_time_s: LogNormal  # pause between a response and the next turn (tool run, user)
    max_context_tokens: ContextTokens = 131072
    scale: Scale = 1.0


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

    def reusable_prefix_tokens(self, turn: int) -> int:
        """Leading tokens of ``turn``'s prompt that were sent before: the previous turn's prompt
        and output, or (turn 0) the shared system prefix. What an unlimited prefix cache serves."""
        if turn == 0:
            return self.system_prefix_tokens
        return self.prompt_tokens(turn) - self.turns[turn].new_tokens

    @property
    def num_turns(self) -> int:
        return len(self.turns)


def generate_sessions(profile: WorkloadProfile, count: int, seed: int = 0) -> list[Session]:
    """``count`` sessions drawn from ``profile``; deterministic in (profile, count, seed).

    Session i depends only on (seed, i), so the first N sessions are the same whatever ``count``.
    """
    return [generate_session(profile, i, seed) for i in range(count)]


def generate_session(profile: WorkloadProfile, index: int, seed: int = 0) -> Session:
    """Session ``index`` of ``generate_sessions(profile, n, seed)`` for any n > index."""
    rng = np.random.default_rng([seed, index])
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
    return Session(session_id=index, system_prefix_tokens=prefix, turns=tuple(turns))


# --- Token ids -----------------------------------------------------------------------------------
# Prompts are sent as token ids so their lengths are exact. The ids are drawn from a seeded
# generator per (seed, part), so the system prefix is identical across sessions, every turn
# re-sends exactly the ids of the conversation so far, and two runs send identical traffic.

DEFAULT_MIN_TOKEN_ID = 1000  # most tokenizers keep byte / special / control tokens below this
_PREFIX_STREAM = 2**31 - 1  # rng stream key of the shared system prefix (not a session index)


def _draw_ids(key: list[int], n: int, vocab_size: int, min_id: int, reserved: frozenset[int]) -> np.ndarray:
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if vocab_size - min_id <= len(reserved):
        raise ValueError(f"no usable token ids in [{min_id}, {vocab_size}) after removing reserved ids")
    rng = np.random.default_rng(key)
    ids = rng.integers(min_id, vocab_size, size=n, dtype=np.int64)
    if reserved:
        # Redraw the few reserved ids from the same stream: still deterministic.
        bad = np.isin(ids, np.fromiter(reserved, dtype=np.int64))
        while bad.any():
            ids[bad] = rng.integers(min_id, vocab_size, size=int(bad.sum()), dtype=np.int64)
            bad = np.isin(ids, np.fromiter(reserved, dtype=np.int64))
    return ids


@dataclass(frozen=True)
class TokenSpace:
    """Which ids prompts may use: [min_id, vocab_size) minus ``reserved_ids`` (eos, pad, specials).

    Pass the tokenizer's count of regular tokens as ``vocab_size`` (not the padded embedding
    size) and its special token ids as ``reserved_ids``.
    """

    vocab_size: int = 32000
    seed: int = 0
    reserved_ids: frozenset[int] = frozenset()
    min_id: int = DEFAULT_MIN_TOKEN_ID

    def __post_init__(self):
        object.__setattr__(self, "reserved_ids", frozenset(int(i) for i in self.reserved_ids))
        if self.min_id >= self.vocab_size:
            # Small test vocabularies: fall back to skipping only the reserved ids.
            object.__setattr__(self, "min_id", 0)
        if self.vocab_size <= 1:
            raise ValueError(f"vocab_size must be > 1, got {self.vocab_size}")

    def system_prefix_ids(self, n: int) -> np.ndarray:
        return _draw_ids([self.seed, _PREFIX_STREAM, n], n, self.vocab_size, self.min_id, self.reserved_ids)

    def new_ids(self, session_id: int, turn: int, n: int) -> np.ndarray:
        return _draw_ids([self.seed, session_id, turn, 0], n, self.vocab_size, self.min_id, self.reserved_ids)

    def output_ids(self, session_id: int, turn: int, n: int) -> np.ndarray:
        """The synthetic stand-in for turn ``turn``'s response (used when the server's is unknown)."""
        return _draw_ids([self.seed, session_id, turn, 1], n, self.vocab_size, self.min_id, self.reserved_ids)


def prompt_token_ids(
    session: Session,
    turn: int,
    vocab_size: int = 32000,
    seed: int = 0,
    *,
    reserved_ids=(),
    min_id: int = DEFAULT_MIN_TOKEN_ID,
    received_output_ids: dict[int, list[int]] | None = None,
) -> list[int]:
    """The token ids of the prompt sent at ``turn``: prefix + (new, output) of earlier turns + new.

    ``received_output_ids[k]``, where given, replaces turn k's synthetic output ids with what the
    server actually generated, so the server's radix cache can match the response too.
    """
    space = TokenSpace(vocab_size=vocab_size, seed=seed, reserved_ids=frozenset(reserved_ids), min_id=min_id)
    return PromptBuilder(session, space).prompt(turn, received_output_ids)


class PromptBuilder:
    """Builds a session's prompts turn after turn without regenerating the earlier ids."""

    def __init__(self, session: Session, space: TokenSpace):
        self.session = session
        self.space = space

    def prompt(self, turn: int, received_output_ids: dict[int, list[int]] | None = None) -> list[int]:
        if not 0 <= turn < self.session.num_turns:
            raise IndexError(f"turn {turn} outside session of {self.session.num_turns} turns")
        received_output_ids = received_output_ids or {}
        parts = [self.space.system_prefix_ids(self.session.system_prefix_tokens)]
        for k in range(turn + 1):
            t = self.session.turns[k]
            parts.append(self.space.new_ids(self.session.session_id, k, t.new_tokens))
            if k < turn:
                parts.append(self.output_for(k, received_output_ids.get(k)))
        return np.concatenate(parts).tolist()

    def output_for(self, turn: int, received: list[int] | None = None) -> np.ndarray:
        if received is not None:
            return np.asarray(received, dtype=np.int64)
        t = self.session.turns[turn]
        return self.space.output_ids(self.session.session_id, turn, t.output_tokens)
