"""The proposer: which configuration to try next, and whether it is worth launching.

Each ``propose()`` asks Optuna for one trial and returns a ``Proposal`` with a ``Decision``:

* the study's first trial is the **baseline** (SGLang's defaults for the hardware, TP = GPUs of the
  node, plus the study's ``baseline`` flags);
* behind it, one per ask, the **queue**: warm-start configurations, then the default sampler's
  planner-ranked seeds or the grid sampler's grid (those already tried are skipped);
* a configuration that breaks a **constraint**, or that the **planner** says cannot fit, is
  settled without launching (``Outcome.not_launched``);
* a **duplicate** of a finished trial is told that trial's capacity; a duplicate of a running one
  is asked again later;
* a **repeat** (``study resume --repeat-trial N``) is an earlier trial's configuration launched
  again first, as a new trial: its capacity measured once more, whatever the first record says.

The proposer only reads: the ledger records and tells what it decides, the loop launches it. It
works on any Optuna study, so a dry run uses it alone on an in-memory one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import yaml

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError, TrialError, UserError
from tuner.lifecycle import Outcome, TrialStatus, config_key
from tuner.planner import plan_memory
from tuner.config.schema import StudySpec
from tuner.study import space as space_mod
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.samplers import grid_configs, seed_configs
from tuner.vocabulary import Engine, Sampler, StrEnum

log = logging.getLogger(__name__)

# Asks that settle without launching (constraint, planner, duplicate) cost nothing, so many of them
# in a row are allowed; this many per launch of the budget, plus a margin, means the space has
# nothing new left to launch.
ASKS_PER_LAUNCH = 20
ASK_MARGIN = 50
PLANNER_REASON_PREFIX = "planner: "  # readable reasons say who screened the configuration out


def max_asks(budget: int) -> int:
    return ASKS_PER_LAUNCH * budget + ASK_MARGIN


class Decision(StrEnum):
    LAUNCH = "launch"
    CONSTRAINT = "constraint"  # violates a constraint of the space: infeasible, not launched
    SCREENED = "screened"  # the planner says it cannot fit: infeasible, not launched
    DUPLICATE = "duplicate"  # same configuration as a finished trial: told its capacity
    DUPLICATE_RUNNING = "duplicate_running"  # same as a running trial: pruned, asked again later


@dataclass(frozen=True)
class Proposal:
    trial: Any  # the Optuna trial it was asked as
    number: int
    values: dict[str, Any]  # knob -> value (None: SGLang's default)
    flags: dict[str, Any]  # server flags
    knobs: dict[str, Any]  # tuner-level knobs
    is_baseline: bool
    decision: Decision
    reason: str | None = None
    duplicate_capacity_users: int | None = None  # DUPLICATE: the capacity it is told
    predicted_kv_capacity_tokens: int | None = None  # the planner's, for the whole node/cluster
    from_queue: bool = False  # an enqueued configuration (warm start, seeds, grid)
    repeat_of: int | None = None  # the earlier trial whose configuration this measures again
    repeat_changes: dict[str, Any] | None = None  # knobs a varied repeat sets otherwise (an A/B of them)

    @property
    def launch(self) -> bool:
        return self.decision is Decision.LAUNCH

    def not_launched_outcome(self) -> Outcome:
        """How a CONSTRAINT or SCREENED proposal ends."""
        if self.decision not in (Decision.CONSTRAINT, Decision.SCREENED):
            raise ValueError(f"a {self.decision} proposal is not settled as not launched")
        return Outcome.not_launched(self.reason or "", screened_by_planner=self.decision is Decision.SCREENED)


@dataclass(frozen=True)
class RepeatRequest:
    """``--repeat-trial N`` or ``N:KNOB=VALUE,...``: trial N's configuration measured again, with
    the given knobs set otherwise (a varied repeat: an A/B of those knobs against trial N)."""

    trial: int
    changes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> "RepeatRequest":
        head, _, rest = str(text).partition(":")
        try:
            n = int(head)
        except ValueError:
            raise ConfigError(f"{text!r}: expected a trial number, optionally followed by :KNOB=VALUE,... "
                              "(e.g. 3 or 3:enable-hierarchical-cache=false)", key="--repeat-trial") from None
        changes: dict[str, Any] = {}
        for item in filter(None, (x.strip() for x in rest.split(","))):
            knob, eq, value = item.partition("=")
            if not eq or not knob.strip():
                raise ConfigError(f"{item!r} in {text!r}: expected KNOB=VALUE", key="--repeat-trial")
            # YAML scalars, as the search space's own values are written: false, 0.85, null, fp8_e4m3
            changes[knob.strip()] = yaml.safe_load(value.strip()) if value.strip() else None
        return cls(n, changes)


def _check_changes(space, changes: dict[str, Any], where: str) -> None:
    for knob, value in changes.items():
        p = space.params.get(knob)
        if p is None:
            raise ConfigError(f"{where}: {knob!r} is not a knob of search space {space.name!r}; valid: "
                              + ", ".join(space.params), key="--repeat-trial")
        if p.values is not None and value not in p.values:
            raise ConfigError(f"{where}: {knob}={value!r} is not one of its values {p.values}", key="--repeat-trial")
        if p.values is None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                 or not p.low <= value <= p.high):
            raise ConfigError(f"{where}: {knob}={value!r} is outside its range [{p.low}, {p.high}]",
                              key="--repeat-trial")


def repeat_configs(study: StudySpec, tried: dict[int, TriedTrial],
                   requests: Iterable[int | RepeatRequest]) -> list[tuple[int, dict, dict]]:
    """``study resume --repeat-trial N[:KNOB=VALUE,...]``: each trial's configuration, with the
    request's changes, as the parameters Optuna should fix (only knobs whose condition holds), and
    the changes. Refused (exit 2): a trial the study does not have, the baseline (SGLang's defaults
    are not a point of the search space), one that never launched (the same checks would settle it
    again), and a change to a knob the space does not have or to a value it does not offer."""
    space, env = study.space(), space_mod.env_for(study)
    out: list[tuple[int, dict, dict]] = []
    for req in requests:
        req = req if isinstance(req, RepeatRequest) else RepeatRequest(int(req))
        n = req.trial
        t = tried.get(n)
        if t is None:
            have = ", ".join(str(k) for k in sorted(tried)) or "none"
            raise ConfigError(f"study {study.name!r} has no trial {n} (its trials: {have})", key="--repeat-trial")
        if t.is_baseline:
            raise ConfigError(f"trial {n} is the baseline, SGLang's defaults rather than a point of the search "
                              "space; repeat a searched trial", key="--repeat-trial")
        if not t.launched:
            raise ConfigError(f"trial {n} never launched ({t.status}): there is no measurement to repeat",
                              key="--repeat-trial")
        _check_changes(space, req.changes, f"--repeat-trial {n}")
        values = {**t.values, **req.changes}
        out.append((n, {k: values.get(k) for k in space.params if space_mod.condition_holds(space, k, values, env)},
                    dict(req.changes)))
    return out


def baseline_values(study: StudySpec) -> dict:
    """Trial 0: every knob at SGLang's default except the study's ``baseline`` flags."""
    values = {name: None for name in study.space().params}
    values.setdefault("tp-size", None)
    values.update(study.baseline)
    if values.get("tp-size") is None and study.space().engine == Engine.SGLANG:
        values["tp-size"] = study.hardware.gpus_per_node
    return values


def planner_verdict(study: StudySpec, flags: dict) -> tuple[bool, str, int | None]:
    """The memory planner before launching: (fits, reason, predicted KV tokens of the node/cluster)."""
    hw = study.hardware
    try:
        plan = plan_memory(get_model(study.model), get_gpu(hw.gpu), hw.gpus_per_node, flags, nodes=hw.nodes,
                           host_memory_gb=hw.host_memory_gb,
                           sglang_version=(study.backend_options or {}).get("sglang_version"))
    except TrialError as exc:
        return False, exc.reason, None
    except UserError as exc:
        return False, str(exc), None
    return bool(plan.fits), plan.reason or "", plan.kv_capacity_tokens_total


@dataclass
class TriedTrial:
    """A trial of an earlier run of the study, as the proposer needs it."""

    values: dict
    status: TrialStatus
    capacity_users: int | None
    is_baseline: bool = False
    launched: bool = True

    @classmethod
    def of_row(cls, row) -> "TriedTrial":
        """From a stored trial row (``tuner.storage.models.TrialRow``)."""
        return cls(row.params, TrialStatus(row.status), row.capacity_users, row.is_baseline, row.launched)


@dataclass
class Proposer:
    study: StudySpec
    optuna: OptunaStudy
    budget: int  # launched trials this run may reach (the grid must fit in it)
    tried: Iterable[TriedTrial] = ()
    initial_configs: list[dict] = field(default_factory=list)  # warm start, right after the baseline
    # (trial number, configuration) of earlier trials to measure again, before anything else
    repeats: list[tuple[int, dict, dict]] = field(default_factory=list)  # (trial, config, changes)
    prescreen: bool = True  # settle what the planner says cannot fit without launching
    verdict: Callable[[StudySpec, dict], tuple[bool, str, int | None]] = planner_verdict
    asks: int = 0

    def __post_init__(self):
        tried = list(self.tried)
        self._first_is_baseline = not tried  # the first trial of a study is its baseline
        # config key -> capacity (None while the configuration runs)
        self._seen: dict[str, int | None] = {config_key(t.values): t.capacity_users for t in tried
                                             if t.status == TrialStatus.COMPLETE}
        self._queue = self._initial_queue({config_key(t.values) for t in tried})
        self._repeats = list(self.repeats)
        self._space, self._env = self.study.space(), space_mod.env_for(self.study)

    # ---------------------------------------------------------------- one ask
    def propose(self) -> Proposal:
        is_baseline, from_queue, repeat_of, changes = self._first_is_baseline, False, None, None
        self._first_is_baseline = False
        if not is_baseline and self._repeats:
            repeat_of, config, changes = self._repeats.pop(0)
            self.optuna.enqueue(config, skip_if_exists=False)  # Optuna would skip a configuration it has seen
            from_queue = True
        elif not is_baseline and self._queue:
            # one at a time, so Optuna holds no waiting trial the budget never reaches
            self.optuna.enqueue(self._queue.pop(0))
            from_queue = True
        trial = self.optuna.ask()
        self.asks += 1
        values = baseline_values(self.study) if is_baseline else space_mod.suggest(trial, self._space, self._env)
        flags, knobs = space_mod.split(values, self._space.engine, space_mod.pinned_flags(self.study))

        def proposal(decision: Decision, **kw) -> Proposal:
            return Proposal(trial, trial.number, values, flags, knobs, is_baseline, decision, from_queue=from_queue,
                            repeat_of=repeat_of, repeat_changes=changes or None, **kw)

        violated = [] if is_baseline else space_mod.violated_constraints(self._space, values, self._env)
        if violated:
            return proposal(Decision.CONSTRAINT, reason="violates constraint(s): " + "; ".join(violated))
        key = config_key(values)
        if key in self._seen and not is_baseline and repeat_of is None:
            capacity = self._seen[key]
            if capacity is None:
                return proposal(Decision.DUPLICATE_RUNNING)
            return proposal(Decision.DUPLICATE, duplicate_capacity_users=capacity)
        predicted_kv = None
        if self._space.engine == Engine.SGLANG:
            fits, reason, predicted_kv = self.verdict(self.study, flags)
            if not fits and self.prescreen:
                return proposal(Decision.SCREENED, reason=PLANNER_REASON_PREFIX + reason,
                                predicted_kv_capacity_tokens=predicted_kv)
        self._seen[key] = None
        return proposal(Decision.LAUNCH, predicted_kv_capacity_tokens=predicted_kv)

    # ---------------------------------------------------------------- what happened
    def learn(self, proposal: Proposal, outcome: Outcome) -> None:
        """A launched proposal ended: a measured capacity (complete, or a pruned lower bound that
        cannot beat the best either) answers its duplicates; anything else may be tried again."""
        key = config_key(proposal.values)
        if outcome.status.measured:
            self._seen[key] = outcome.capacity_users
        else:
            self._seen.pop(key, None)

    # ---------------------------------------------------------------- the queue
    def _initial_queue(self, tried: set[str]) -> list[dict]:
        """Warm-start configurations, then the default sampler's planner-ranked seeds
        (tuner.study.samplers.seed_configs) or the grid sampler's grid; already tried ones skipped."""
        configs = list(self.initial_configs)
        if self.study.sampler == Sampler.DEFAULT:
            try:
                configs += seed_configs(self.study)
            except Exception:  # seeds are an optimisation: a planner gap must not stop the study
                log.warning("planner-ranked seeds unavailable", exc_info=True)
        elif self.study.sampler == Sampler.GRID:
            configs += grid_configs(self.study, self.budget)
        out, keys = [], set(tried)
        for cfg in configs:
            if config_key(cfg) not in keys:
                keys.add(config_key(cfg))
                out.append(cfg)
        return out
