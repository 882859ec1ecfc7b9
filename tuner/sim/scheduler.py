"""SGLang's scheduling rules for one KV pool (one attention-DP rank), as data plus small helpers.

Every rule here is read from SGLang's own scheduler and is cited in docs/calibration.md
("Simulator scheduler"). Where SGLang 0.5.17 and 0.5.23 differ, ``SchedulerRules.for_version``
picks the trial's version. The event loop that applies the rules is ``tuner.sim.engine``; it is
shared by ``tuner simulate`` (offline) and ``tuner serve-sim`` (online).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from tuner.errors import ConfigError
from tuner.planner.memory import rules_version
from tuner.planner.parallel import flag_bool, flag_float, flag_int

DEFAULT_SGLANG_VERSION = "0.5.23"
SUPPORTED_SGLANG_VERSIONS = ("0.5.17", "0.5.23")

# SGLang environment defaults (srt/environ.py, identical in 0.5.17 and 0.5.23)
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
LPM_MAX_QUEUE = 128  # SchedulePolicy._determine_active_policy: lpm falls back to fcfs above this
HICACHE_LOAD_BACK_THRESHOLD = 10  # HiRadixCache.load_back: fewer host tokens are recomputed instead
MAX_PREFILL_TOKENS = 16384  # --max-prefill-tokens default


def version_tuple(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a version string such as ``0.5.17`` or ``0.5.17.post1``."""
    parts = re.findall(r"\d+", str(version))[:3]
    if len(parts) < 2:
        raise ConfigError(f"not a SGLang version: {version!r}; supported: {', '.join(SUPPORTED_SGLANG_VERSIONS)}",
                          key="sglang_version")
    parts += ["0"] * (3 - len(parts))
    return int(parts[0]), int(parts[1]), int(parts[2])


def check_version(version: str | None) -> str:
    """The SGLang version whose rules apply (``tuner.planner.memory.rules_version``): releases
    before 0.5.20 follow 0.5.17, later ones 0.5.23; None means 0.5.23."""

    return ".".join(map(str, rules_version(version)))


class Policy(enum.Enum):
    FCFS = "fcfs"
    LPM = "lpm"


SCHEDULE_POLICIES = ("fcfs", "lpm", "random", "lof", "dfs-weight", "priority", "routing-key", "hrrn",
                     "shortest-prefill-first")


@dataclass(frozen=True)
class SchedulerRules:
    """What one rank's scheduler does, resolved from the server flags and the trial's version."""

    sglang_version: str
    page_size: int
    chunked_prefill_size: int | None  # None: chunked prefill disabled (flag <= 0)
    max_prefill_tokens: int
    max_running_requests: int
    mixed_chunk: bool
    overlap: bool  # overlap scheduler (CPU scheduling hidden behind the GPU step)
    policy: Policy
    radix_cache: bool
    hierarchical_cache: bool
    init_new_token_ratio: float
    min_new_token_ratio: float
    new_token_ratio_decay: float
    retract_decode_steps: int = RETRACT_DECODE_STEPS
    clip_max_new_tokens: int = CLIP_MAX_NEW_TOKENS
    # 0.5.23: running requests with ignore_eos reserve their whole remaining output (ratio 1.0)
    ignore_eos_full_reserve: bool = False
    hicache_load_back_threshold: int = HICACHE_LOAD_BACK_THRESHOLD

    @classmethod
    def for_version(cls, version: str | None, *, page_size: int, chunked_prefill_size: int,
                    max_running_requests: int, attn_dp: int, flags: dict[str, Any],
                    hierarchical_cache: bool = False) -> "SchedulerRules":

        version = check_version(version)
        policy_name = str(flags.get("schedule-policy") or "fcfs")
        if policy_name not in SCHEDULE_POLICIES:
            raise ConfigError(f"unknown schedule-policy {policy_name!r}; valid: {', '.join(SCHEDULE_POLICIES)}",
                              key="schedule-policy")
        radix = not flag_bool(flags, "disable-radix-cache")
        # cache-aware policies become fcfs without a tree (SchedulePolicy._validate_and_adjust_policy);
        # the other cache-agnostic orders are taken as fcfs (all users here have equal priority)
        policy = Policy.LPM if policy_name == "lpm" and radix else Policy.FCFS
        conservativeness = flag_float(flags, "schedule-conservativeness")
        conservativeness = 1.0 if conservativeness is None else conservativeness
        if attn_dp > 1:
            conservativeness *= 0.3  # ServerArgs._handle_data_parallelism
        init = min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)
        low = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        chunk = chunked_prefill_size if chunked_prefill_size and chunked_prefill_size > 0 else None
        pp = flag_int(flags, "pp-size", 1)
        return cls(
            sglang_version=version,
            page_size=max(1, int(page_size)),
            chunked_prefill_size=chunk,
            max_prefill_tokens=flag_int(flags, "max-prefill-tokens", MAX_PREFILL_TOKENS),
            max_running_requests=max(1, int(max_running_requests)),
            mixed_chunk=chunk is not None and flag_bool(flags, "enable-mixed-chunk"),
            overlap=not flag_bool(flags, "disable-overlap-schedule") and pp == 1,
            policy=policy,
            radix_cache=radix,
            hierarchical_cache=hierarchical_cache and radix,
            init_new_token_ratio=init,
            min_new_token_ratio=low,
            new_token_ratio_decay=(init - low) / NEW_TOKEN_RATIO_DECAY_STEPS,
            ignore_eos_full_reserve=version_tuple(version) >= (0, 5, 23),
        )

    def ceil_page(self, tokens: int) -> int:
        p = self.page_size
        return -(-tokens // p) * p

    def clamp_max_new_tokens(self, input_len: int, max_new_tokens: int, kv_capacity_tokens: int,
                             context_len: int) -> int:
        """``Scheduler.init_req_max_new_tokens``: a request always fits an empty pool."""
        return max(0, min(max_new_tokens, context_len - input_len - 1,
                          kv_capacity_tokens - self.ceil_page(input_len) - self.page_size - 1))


class NewTokenRatio:
    """``NewTokenRatioTracker``: the share of their remaining output that running requests are
    assumed to still need when a prefill is admitted. Starts at ``init``, decays linearly to ``min``
    over 600 decode steps, jumps to an estimate after a retraction, resets when the rank is idle."""

    __slots__ = ("init", "min", "decay", "current")

    def __init__(self, rules: SchedulerRules):
        self.init, self.min, self.decay = rules.init_new_token_ratio, rules.min_new_token_ratio, \
            rules.new_token_ratio_decay
        self.current = self.init

    def decay_steps(self, k: int = 1) -> None:
        self.current = max(self.current - self.decay * k, self.min)

    def reset(self) -> None:
        self.current = self.init

    def after_retract(self, decoded_tokens: int, max_new_tokens: int, remaining_reqs: int) -> None:
        """``estimate_new_token_ratio_after_retract`` over the requests left running."""
        self.current = min(1.0, (decoded_tokens + RETRACT_DECODE_STEPS * remaining_reqs) / (max_new_tokens + 1))


class AddResult(enum.Enum):
    """``AddReqResult`` of SGLang's PrefillAdder."""

    CONTINUE = "continue"
    NO_TOKEN = "no_token"  # the KV budget is exhausted: stop and mark the batch full
    OTHER = "other"  # the step's token budget is exhausted: stop
