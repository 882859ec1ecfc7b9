"""Close the loop on an export: start SGLang from the exported ``--config`` YAML and replay the
study's workload at the trial's capacity, then compare with what the trial measured there.

The server is started the way the export's header says (``launch: sglang serve --config F
[flags its --config parser refuses]``), on this machine's GPUs, with the launch-only arguments a
study adds (host, port, and for dummy-weight studies ``--model-path <rendered config>
--load-format dummy --skip-tokenizer-init``). One load point is replayed with the study's
workload, window and seed rule, reached as the trial's was: the point's own warm-up, and a server
that has compiled its kernels (the kernel warm-up) where the trial's point was not its server's
first. P90 TTFT and P90 TPOT are set against the trial's measurement at the same user count, and
both against the study's SLO.

The measurement compared against may come from another trial of the same configuration (a
``--repeat-trial`` of the exported one, complete or interrupted after the point): a repeat
measured with a longer window is the better reference, and the check then replays that trial's
point (its seed, warm-up and window).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, StudyNotFoundError
from tuner.backends.sglang import SGLangBackend
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.live import LiveEvaluator
from tuner.study.executor import deploy_here
from tuner.workload.metrics import SPREAD_KEY

AGREEMENT = 0.10  # |exported - trial| / trial for P90 TTFT and P90 TPOT


@dataclass
class ExportCheck:
    study: str
    trial_number: int
    users: int
    config_path: str
    launch_args: list[str]
    trial_p90_ttft_s: float
    trial_p90_tpot_s: float
    export_p90_ttft_s: float | None
    export_p90_tpot_s: float | None
    ttft_rel_diff: float | None
    tpot_rel_diff: float | None
    export_meets_slo: bool
    within_agreement: bool
    requests: int
    server_ready_s: float | None
    kv_capacity_tokens: int | None
    replay_warmup_s: float | None = None  # the trial's point's own warm-up, replayed
    # the sampling spread of each P90 (a 90% interval from order statistics, {"ttft_s": [lo, hi], "tpot_s": [...]}):
    # a difference inside both is one the windows' own noise can make
    trial_p90_spread: dict | None = None
    export_p90_spread: dict | None = None
    server_before_window: str = ""  # fresh, or warmed by the kernel warm-up (and why)
    kernel_warmup: dict | None = None  # what that warm-up ran, when the check ran it itself
    note: str = ""
    reference_trial_number: int | None = None  # whose measurement trial_p90_* are (a repeat, or the trial)

    @property
    def ok(self) -> bool:
        return self.within_agreement and self.export_meets_slo

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "agreement": AGREEMENT}


def launch_args_from_header(text: str) -> list[str]:
    """The arguments after ``--config FILE`` on the export header's ``launch:`` line."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("#").strip()
        if body.startswith("launch:"):
            argv = shlex.split(body.removeprefix("launch:"))
            if "--config" not in argv:
                raise ConfigError("the export's launch line has no --config", key="launch")
            i = argv.index("--config")
            return argv[i + 2:]
    raise ConfigError("no 'launch:' line in the header: not a file written by `tuner study export`", key="header")


def _reference(trial: dict, users: int) -> dict:
    points = [m for m in trial.get("measurements") or [] if m["users"] == users and m.get("valid", True)]
    if not points:
        have = sorted({m["users"] for m in trial.get("measurements") or []})
        raise ConfigError(f"trial {trial['number']} has no measurement at {users} users; it has {have}", key="--users")
    return points[-1]


def reference_trial(summary: dict, exported: dict, number: int | None) -> dict:
    """The trial whose measurement the check compares against: the exported one, or trial
    ``number`` when it ran the same configuration (flags and knobs) and so measured the same thing."""
    if number is None or number == exported["number"]:
        return exported
    for t in summary["trials"]:
        if t["number"] != number:
            continue
        ours, theirs = dict(exported.get("flags") or {}), dict(t.get("flags") or {})
        if ours != theirs or dict(exported.get("knobs") or {}) != dict(t.get("knobs") or {}):
            differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
            raise ConfigError(f"trial {number} ran another configuration than the exported trial "
                              f"{exported['number']} (flags that differ: {', '.join(differ) or 'knobs'}); "
                              f"a reference must be a repeat of it", key="--reference-trial")
        if not t.get("measurements"):
            raise ConfigError(f"trial {number} measured no load point ({t['status']})", key="--reference-trial")
        return t
    raise ConfigError(f"study {summary['name']!r} has no trial {number}", key="--reference-trial")


def replay_conditions(measurement, ref: dict):
    """The study's measurement spec set to reach the window the way the trial's point did: its
    warm-up (recorded with the point; a point from before tuner recorded it used the study's plain
    ``warmup_s``, ``first_warmup_s`` did not exist yet) and whether the kernel warm-up ran. A study
    resumed with a longer first warm-up would otherwise replay a later, quieter window than the
    trial measured; and its window, which a study resumed with ``--duration-s`` may have changed."""
    warmup_s, duration_s = ref.get("warmup_s"), ref.get("duration_s")
    return measurement.model_copy(update={
        "warmup_s": float(warmup_s if warmup_s is not None else measurement.warmup_s),
        "duration_s": float(duration_s if duration_s else measurement.duration_s),  # the point's own window
        "first_warmup_s": None,
        "kernel_warmup": bool(ref.get("kernel_warmup")),
    })


def verify_export(storage: str, name: str, config_path: str, *, users: int | None = None,
                  trial_number: int | None = None, reference_trial_number: int | None = None,
                  workdir: str = "results/runs") -> ExportCheck:
    from tuner.study.export import _pick
    from tuner.study.runner import load_existing
    from tuner.study.summary import study_summary

    path = Path(config_path)
    if not path.is_file():
        raise ConfigError("the exported YAML does not exist", file=str(path))
    text = path.read_text()
    launch_args = launch_args_from_header(text)
    summary = study_summary(storage, name)
    spec = load_existing(storage, name, notes=[])
    if spec.space().engine != "sglang":
        raise ConfigError("only SGLang studies export a --config file to verify", key="study")
    trial = _pick(summary, trial_number)
    users = users or trial.get("capacity_users")
    if not users:
        raise StudyNotFoundError(f"trial {trial['number']} has no capacity to replay at; give --users")
    measured_by = reference_trial(summary, trial, reference_trial_number)
    ref = _reference(measured_by, users)
    spec = spec.model_copy(update={"measurement": replay_conditions(spec.measurement, ref)})

    class ExportedConfig(SGLangBackend):
        """The trial's launch plan with the exported file (and its launch line) in place of the trial's."""

        def build_plan(self, request, trial_dir):
            plan = super().build_plan(request, trial_dir)
            for spec_ in plan.servers:
                argv = list(spec_.argv)
                i = argv.index("--config")
                argv[i + 1] = str(path.resolve())
                for flag in plan.facts.get("command_line_flags") or []:  # the trial's own overflow ...
                    if flag in argv:
                        argv.remove(flag)
                spec_.argv = [*argv, *launch_args]  # ... replaced by what the export says to pass
            plan.files["config"] = str(path.resolve())
            return plan

    request = TrialRequest(study=spec, trial_number=trial["number"], flags=dict(trial["flags"]),
                           knobs=dict(trial["knobs"]), workdir=f"{Path(workdir).resolve()}/{name}-export-check",
                           seed=spec.seed + measured_by["number"])  # the reference point's sessions
    deployment = deploy_here(LiveEvaluator(ExportedConfig()), request)
    step = int(ref.get("step", 0))
    warmed = None
    try:
        if step > 0 and not spec.measurement.kernel_warmup:
            # the trial's point was its server's load point step + 1: a server that had compiled the
            # kernels its traffic needs. The check's server is fresh, so it runs them first
            warmed = deployment.warm_kernels()
        # the trial's first load point used seed + 1009 * step: replay the step that measured `users`
        deployment.measurements = step
        metrics = deployment.measure(users)
        tel = deployment.telemetry()
    finally:
        deployment.close()
    slo = spec.slo

    def rel(a, b):
        return None if a is None or not b else round(abs(a - b) / b, 4)

    d_ttft, d_tpot = rel(metrics.p90_ttft_s, ref["p90_ttft_s"]), rel(metrics.p90_tpot_s, ref["p90_tpot_s"])
    meets = bool(metrics.valid and metrics.p90_ttft_s is not None and metrics.p90_tpot_s is not None
                 and metrics.p90_ttft_s <= slo.p90_ttft_s and metrics.p90_tpot_s <= slo.p90_tpot_s)
    ready = tel.get("ready_after_s") or {}
    return ExportCheck(
        study=name, trial_number=trial["number"], reference_trial_number=measured_by["number"], users=users,
        config_path=str(path), launch_args=launch_args,
        trial_p90_ttft_s=ref["p90_ttft_s"], trial_p90_tpot_s=ref["p90_tpot_s"],
        export_p90_ttft_s=metrics.p90_ttft_s, export_p90_tpot_s=metrics.p90_tpot_s,
        ttft_rel_diff=d_ttft, tpot_rel_diff=d_tpot, export_meets_slo=meets,
        within_agreement=d_ttft is not None and d_tpot is not None and d_ttft <= AGREEMENT and d_tpot <= AGREEMENT,
        requests=metrics.requests, server_ready_s=next(iter(ready.values()), None),
        kv_capacity_tokens=deployment.measured_kv_capacity_tokens_total,
        replay_warmup_s=spec.measurement.warmup_s,
        trial_p90_spread=ref.get("p90_spread"), export_p90_spread=(metrics.extra or {}).get(SPREAD_KEY),
        server_before_window=("kernel warm-up, as the trial's server had served "
                              f"{step} load point(s) before" if warmed is not None else
                              "kernel warm-up, as the trial's point had" if spec.measurement.kernel_warmup else
                              "fresh, as the trial's server was"),
        kernel_warmup=warmed.to_dict() if warmed is not None else None,
        note="" if metrics.valid else f"invalid load point: {metrics.invalid_reason}")
