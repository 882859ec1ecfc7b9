"""The binding cause of a load point, and of a trial at its capacity, in one sentence.

A load point that misses a target is explained by the cause that accounts for most of it. Root
causes come first when their figure is large enough (the client at its ceiling, evicted context
re-prefilled, context re-computed on the wrong pool, HiCache load-back, one rank carrying more
than its share, GPUs idle while throughput plateaus); otherwise the proximate one (for TTFT:
waiting for admission or the prefill compute itself; for TPOT: decode waiting behind prefill
batches or the decode step, split into its parts).

A trial is bound by its smallest load point above its capacity that misses a target: "misses
P90 TTFT at 40 users (15.4 s, target 10 s): 61% of prefill tokens re-compute evicted context (KV
pool 0.72 M tokens, working set 2.1 M)". The causes that trial could not observe are listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.explain import evidence, fmt
from tuner.explain.causes import Cause, Coverage, Finding, Metric
from tuner.explain.inputs import LoadPoint, StudyContext, TrialFacts
from tuner.lifecycle import TrialStatus
from tuner.vocabulary import StrEnum

# how large a root cause's figure must be to bind (share of the work or time behind the miss)
ROOT_THRESHOLDS = {
    Cause.CLIENT: 1.0, Cause.GPU_SLOWDOWN: evidence.GPU_SLOWDOWN_BINDS, Cause.KV_CAPACITY: 0.2,
    Cause.ROUTING: 0.2, Cause.HOST_LINK: 0.25, Cause.IMBALANCE: 0.25, Cause.GPU_IDLE: 0.3,
}
TTFT_ROOTS = (Cause.CLIENT, Cause.GPU_SLOWDOWN, Cause.KV_CAPACITY, Cause.ROUTING, Cause.HOST_LINK, Cause.IMBALANCE)
TPOT_ROOTS = (Cause.CLIENT, Cause.GPU_SLOWDOWN, Cause.GPU_IDLE, Cause.IMBALANCE)
# causes that put the measurement itself in doubt: said first when they bind, whatever else does
MEASUREMENT_ROOTS = (Cause.CLIENT, Cause.GPU_SLOWDOWN)
# prefill interference this large with re-prefills behind it makes KV (or routing) the root of a TPOT miss
INTERFERENCE_FOR_KV = 0.3
QUEUEING_BINDS = 0.5
INTERFERENCE_BINDS = 0.5
SECONDARY_INTERFERENCE = 0.2  # mentioned beside a decode-step verdict from this share on


class Bound(StrEnum):
    """What ends a trial's capacity."""

    MISSED_TARGET = "missed_target"  # a measured load point above the capacity misses a target
    SEARCH_LIMIT = "search_limit"  # meets both targets at the capacity search's largest user count
    NOT_REACHED = "not_reached"  # stopped (pruned, interrupted) before a load point missed
    DID_NOT_SERVE = "did_not_serve"  # crashed, ran out of memory, hung ...
    NOT_LAUNCHED = "not_launched"  # a constraint or the planner settled it without launching
    IN_PROGRESS = "in_progress"  # the trial is still measuring
    NO_POINTS = "no_points"


@dataclass(frozen=True)
class PointDiagnosis:
    users: int
    missed: tuple[Metric, ...]
    binding: Finding | None  # None when the point meets both targets, or nothing was observed
    secondary: Finding | None  # the proximate cause behind a root cause, when it says more
    findings: tuple[Finding, ...]
    sentence: str

    @property
    def meets(self) -> bool:
        return not self.missed

    def finding(self, cause: Cause) -> Finding | None:
        cause = Cause(cause)
        return next((f for f in self.findings if f.cause is cause), None)

    def not_observed(self) -> list[Finding]:
        return [f for f in self.findings if f.coverage is Coverage.NOT_MEASURED]

    def to_dict(self) -> dict:
        return {"users": self.users, "missed": [str(m) for m in self.missed],
                "binding": self.binding.cause.value if self.binding else None,
                "binding_coverage": self.binding.coverage.value if self.binding else None,
                "secondary": self.secondary.cause.value if self.secondary else None,
                "sentence": self.sentence, "findings": [f.to_dict() for f in self.findings]}


@dataclass(frozen=True)
class TrialDiagnosis:
    trial: int
    status: str
    capacity_users: int | None
    bound: Bound
    sentence: str
    binding: Cause | None = None
    point: PointDiagnosis | None = None  # the load point that bounds the capacity
    not_measured: tuple[dict, ...] = ()  # {cause, title, why}: causes the trial could not observe
    points: tuple[PointDiagnosis, ...] = field(default=())

    def to_dict(self, with_points: bool = True) -> dict:
        d = {"trial": self.trial, "status": self.status, "capacity_users": self.capacity_users,
             "bound": self.bound.value, "binding": self.binding.value if self.binding else None,
             "sentence": self.sentence, "point": self.point.to_dict() if self.point else None,
             "not_measured": list(self.not_measured)}
        if with_points:
            d["points"] = [p.to_dict() for p in self.points]
        return d


def _missed(p: LoadPoint, ctx: StudyContext) -> tuple[Metric, ...]:
    if not p.valid:
        return (Metric.ERRORS,)
    over = []
    if p.p90_ttft_s is None or p.p90_ttft_s > ctx.p90_ttft_slo_s:
        over.append((Metric.TTFT, (p.p90_ttft_s or float("inf")) / ctx.p90_ttft_slo_s))
    if p.p90_tpot_s is None or p.p90_tpot_s > ctx.p90_tpot_slo_s:
        over.append((Metric.TPOT, (p.p90_tpot_s or float("inf")) / ctx.p90_tpot_slo_s))
    over.sort(key=lambda x: -x[1])  # the target missed by the larger factor first
    return tuple(m for m, _ in over)


def findings_at(p: LoadPoint, trial: TrialFacts, ctx: StudyContext, prev: LoadPoint | None = None) -> dict[Cause, Finding]:
    kv, route = evidence.kv_and_routing(p, trial, ctx)
    queue, compute = evidence.queueing(p)
    step, inter = evidence.decode(p)
    found = [evidence.client(p), evidence.gpu_slowdown(p), kv, route, evidence.host_link(p, trial, ctx),
             evidence.imbalance(p, trial), evidence.gpu_idle(p, prev, trial), inter, queue, compute, step,
             evidence.failed_requests(p)]
    return {f.cause: f for f in found}


def _strong(f: Finding | None) -> bool:
    return f is not None and f.observed and f.share is not None and f.share >= ROOT_THRESHOLDS.get(f.cause, 1.0)


def _best_root(found: dict[Cause, Finding], roots) -> Finding | None:
    strong = [found[c] for c in roots if _strong(found.get(c))]
    if not strong:
        return None
    for cause in MEASUREMENT_ROOTS:  # the measurement itself is in doubt: say so first
        if found.get(cause) in strong:
            return found[cause]
    return max(strong, key=lambda f: f.share)


def _choose(metric: Metric, found: dict[Cause, Finding]) -> tuple[Finding | None, Finding | None]:
    """(binding finding, secondary finding) for one missed metric."""
    if metric is Metric.ERRORS:
        client = found.get(Cause.CLIENT)
        return (client, found[Cause.FAILED_REQUESTS]) if _strong(client) else (found[Cause.FAILED_REQUESTS], None)
    if metric is Metric.TTFT:
        queue, compute = found.get(Cause.PREFILL_QUEUEING), found.get(Cause.PREFILL_COMPUTE)
        proximate = None
        if queue is not None and queue.observed:
            proximate = queue if (queue.share or 0) >= QUEUEING_BINDS else compute
        root = _best_root(found, TTFT_ROOTS)
        if root is not None:
            return root, proximate
        return proximate, None
    inter, step = found.get(Cause.PREFILL_INTERFERENCE), found.get(Cause.DECODE_STEP)
    proximate = None
    if inter is not None and inter.observed and (inter.share or 0) >= INTERFERENCE_BINDS:
        proximate = inter
    elif step is not None and step.observed:
        proximate = step
    root = _best_root(found, TPOT_ROOTS)
    if root is None and inter is not None and inter.observed and (inter.share or 0) >= INTERFERENCE_FOR_KV:
        # decode stalls behind prefills that re-compute evicted (or mis-routed) context
        root = _best_root(found, (Cause.KV_CAPACITY, Cause.ROUTING))
        if root is not None:
            return root, inter
    if root is not None:
        return root, proximate
    if proximate is step and inter is not None and inter.observed and (inter.share or 0) >= SECONDARY_INTERFERENCE:
        return step, inter
    return proximate, None


def _head(metric: Metric, p: LoadPoint, ctx: StudyContext, missed: tuple[Metric, ...]) -> str:
    if metric is Metric.ERRORS:
        return f"fails at {p.users} users"
    names = " and ".join(f"P90 {m.value.upper()}" for m in missed)
    if metric is Metric.TTFT:
        figure = f"{fmt.seconds(p.p90_ttft_s)}, target {fmt.seconds(ctx.p90_ttft_slo_s)}"
    else:
        figure = f"{fmt.ms(p.p90_tpot_s)}, target {fmt.ms(ctx.p90_tpot_slo_s)}"
    return f"misses {names} at {p.users} users ({figure})"


def diagnose_point(p: LoadPoint, trial: TrialFacts, ctx: StudyContext, prev: LoadPoint | None = None) -> PointDiagnosis:
    found = findings_at(p, trial, ctx, prev)
    missed = _missed(p, ctx)
    if not missed:
        headroom = []
        if p.p90_ttft_s is not None:
            headroom.append(f"P90 TTFT {fmt.seconds(p.p90_ttft_s)} ({fmt.pct(p.p90_ttft_s / ctx.p90_ttft_slo_s)} "
                            "of its target)")
        if p.p90_tpot_s is not None:
            headroom.append(f"P90 TPOT {fmt.ms(p.p90_tpot_s)} ({fmt.pct(p.p90_tpot_s / ctx.p90_tpot_slo_s)})")
        return PointDiagnosis(p.users, (), None, None, tuple(found.values()),
                              f"meets both targets at {p.users} users: " + ", ".join(headroom))
    binding, secondary = _choose(missed[0], found)
    head = _head(missed[0], p, ctx, missed)
    if binding is None:
        sentence = f"{head}; the trial recorded nothing that says why"
    else:
        sentence = f"{head}: {binding.text}"
        if secondary is not None and secondary.cause is not binding.cause:
            sentence += f"; {secondary.text}"
    return PointDiagnosis(p.users, missed, binding, secondary, tuple(found.values()), sentence)


def diagnose_points(points: list[LoadPoint], trial: TrialFacts, ctx: StudyContext) -> list[PointDiagnosis]:
    """Every load point in user order, each compared with the next smaller one (plateau test)."""
    ordered = sorted(points, key=lambda q: (q.users, q.step))
    out, prev = [], None
    for p in ordered:
        out.append(diagnose_point(p, trial, ctx, prev if prev is not None and prev.users < p.users else None))
        prev = p
    return out


def _not_measured(d: PointDiagnosis | None) -> tuple[dict, ...]:
    if d is None:
        return ()
    out = [{"cause": f.cause.value, "title": f.cause.title, "why": f.text} for f in d.not_observed()]
    out += [{"cause": f.cause.value, "title": f.cause.title, "why": f.missing} for f in d.findings
            if f.missing and f.coverage is not Coverage.NOT_MEASURED]
    return tuple(out)


def short_reason(reason: str | None, limit: int = 240) -> str:
    """A failure reason cut to ``limit`` characters, keeping a trailing parenthesis (where the
    failure happened, e.g. "(while capturing decode CUDA graphs ...)")."""
    text = " ".join((reason or "").split())
    if len(text) <= limit:
        return text
    tail = ""
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                tail = text[i:]
                break
    if tail and len(tail) < limit * 2 // 3:
        return text[:limit - len(tail) - 2].rstrip() + " … " + tail
    return text[:limit - 1].rstrip() + "…"


def diagnose_trial(trial: TrialFacts, points: list[LoadPoint], ctx: StudyContext) -> TrialDiagnosis:
    """The binding cause at the trial's capacity, and a diagnosis of every load point."""
    diagnosed = diagnose_points(points, trial, ctx)
    status = trial.status
    base = dict(trial=trial.number, status=status.value, capacity_users=trial.capacity_users, points=tuple(diagnosed))
    if not trial.launched:
        what = "screened out by the planner" if trial.screened_by_planner else "not launched"
        return TrialDiagnosis(bound=Bound.NOT_LAUNCHED,
                              sentence=f"{what}: {short_reason(trial.failure_reason) or 'it cannot run'}", **base)
    if status in (TrialStatus.FAILED, TrialStatus.INFEASIBLE) and not diagnosed:
        reason = short_reason(trial.failure_reason)
        return TrialDiagnosis(bound=Bound.DID_NOT_SERVE, sentence=f"did not serve ({trial.failure_class or status.value})"
                              + (f": {reason}" if reason else ""), **base)
    if not diagnosed:
        bound = Bound.IN_PROGRESS if status is TrialStatus.RUNNING else Bound.NO_POINTS
        return TrialDiagnosis(bound=bound, sentence="no load point measured yet" if bound is Bound.IN_PROGRESS
                              else "no load point was measured", **base)
    cap = trial.capacity_users or 0
    failing = [d for d in diagnosed if d.missed and d.users > cap]
    if failing:
        d = failing[0]
        return TrialDiagnosis(bound=Bound.MISSED_TARGET, sentence=d.sentence,
                              binding=d.binding.cause if d.binding else None, point=d,
                              not_measured=_not_measured(d), **base)
    top = max((d for d in diagnosed if d.users <= max(cap, 0) and d.meets), key=lambda d: d.users, default=diagnosed[-1])
    if status is TrialStatus.COMPLETE and ctx.max_users and cap >= ctx.max_users:
        sentence = f"not bound within the search: {top.sentence} (the capacity search's largest user count)"
        return TrialDiagnosis(bound=Bound.SEARCH_LIMIT, sentence=sentence, point=top, not_measured=_not_measured(top),
                              **base)
    if status in (TrialStatus.FAILED, TrialStatus.INFEASIBLE):
        reason = short_reason(trial.failure_reason)
        return TrialDiagnosis(bound=Bound.DID_NOT_SERVE, sentence=f"failed after {top.users} users "
                              f"({trial.failure_class or status.value})" + (f": {reason}" if reason else ""),
                              point=top, not_measured=_not_measured(top), **base)
    why = {TrialStatus.PRUNED: "stopped early (could not beat the best)", TrialStatus.RUNNING: "still running",
           TrialStatus.INTERRUPTED: "stopped by the tuner process ending"}.get(status, "no load point above it missed a target")
    return TrialDiagnosis(bound=Bound.IN_PROGRESS if status is TrialStatus.RUNNING else Bound.NOT_REACHED,
                          sentence=f"{why} before a load point missed a target; {top.sentence}", point=top,
                          not_measured=_not_measured(top), **base)
