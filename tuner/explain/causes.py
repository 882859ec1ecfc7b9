"""The vocabulary of a diagnosis: the causes a load point can be bound by, how well each was
observed, and one finding per cause with the figures behind it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from tuner.vocabulary import StrEnum


class Cause(StrEnum):
    """What bounds a load point. The first five are root causes other causes follow from."""

    CLIENT = "client"  # the replay client at its own ceiling: the latencies include its delay
    GPU_SLOWDOWN = "gpu_slowdown"  # a GPU ran below its clock ceiling (power or thermal limits)
    KV_CAPACITY = "kv_capacity"  # evicted context re-prefilled: the KV pool is smaller than the working set
    ROUTING = "routing"  # context re-prefilled on a KV pool other than the one that holds it
    HOST_LINK = "host_link"  # HiCache load-back over the host link
    IMBALANCE = "imbalance"  # one attention-DP rank or replica carries more than its share
    GPU_IDLE = "gpu_idle"  # GPUs idle while throughput plateaus (kernel configs, scheduler, client)
    PREFILL_INTERFERENCE = "prefill_interference"  # decode waits behind prefill batches
    PREFILL_QUEUEING = "prefill_queueing"  # requests wait for admission
    PREFILL_COMPUTE = "prefill_compute"  # computing the new tokens themselves
    DECODE_STEP = "decode_step"  # the decode step itself (attention, MoE, dense, communication, overhead)
    FAILED_REQUESTS = "failed_requests"  # too many requests failed for the load point to count

    @property
    def title(self) -> str:
        return _TITLES[self]


_TITLES = {
    Cause.CLIENT: "replay client", Cause.GPU_SLOWDOWN: "GPU clock below its ceiling",
    Cause.KV_CAPACITY: "KV capacity", Cause.ROUTING: "routing",
    Cause.HOST_LINK: "host link (HiCache load-back)", Cause.IMBALANCE: "imbalance across ranks",
    Cause.GPU_IDLE: "GPUs idle while throughput plateaus", Cause.PREFILL_INTERFERENCE: "prefill interrupting decode",
    Cause.PREFILL_QUEUEING: "prefill queueing", Cause.PREFILL_COMPUTE: "prefill compute",
    Cause.DECODE_STEP: "decode step time", Cause.FAILED_REQUESTS: "failed requests",
}


class Coverage(StrEnum):
    """How a finding's figures were obtained."""

    MEASURED = "measured"  # the server's or the client's own counters
    SIMULATED = "simulated"  # the simulator's event log and step-time model
    ESTIMATED = "estimated"  # derived from measured figures and the workload model
    NOT_MEASURED = "not_measured"  # the trial recorded nothing that tells
    NOT_APPLICABLE = "not_applicable"  # the cause cannot arise in this configuration

    @property
    def observed(self) -> bool:
        return self in (Coverage.MEASURED, Coverage.SIMULATED, Coverage.ESTIMATED)


class Metric(StrEnum):
    """The target a load point misses."""

    TTFT = "ttft"
    TPOT = "tpot"
    ERRORS = "errors"


@dataclass(frozen=True)
class Finding:
    """One cause at one load point.

    ``share`` is the fraction of the missed metric (or of the work behind it) the cause accounts
    for, 0..1; ``None`` when it was not observed. ``text`` is the clause a sentence uses, with its
    figures; ``figures`` holds the same numbers for machines; ``missing`` says what part of the
    cause the trial could not observe (e.g. the decode step's split on a real server).
    """

    cause: Cause
    coverage: Coverage
    share: float | None = None
    text: str = ""
    figures: dict = field(default_factory=dict)
    missing: str = ""

    @property
    def observed(self) -> bool:
        return self.coverage.observed

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cause"] = str(self.cause)
        d["coverage"] = str(self.coverage)
        d["title"] = self.cause.title
        return d
