"""Why a trial serves what it serves: the binding cause of every load point and of each trial at
its capacity, from what was stored (the server's own metrics, the replay client's records, NVML
telemetry, the simulator's window report); and what-if capacities at other targets from the
stored load points. Reads stored data only: nothing is re-run."""

from tuner.explain.causes import Cause, Coverage, Finding, Metric
from tuner.explain.diagnose import Bound, PointDiagnosis, TrialDiagnosis, diagnose_point, diagnose_points, diagnose_trial
from tuner.explain.inputs import LoadPoint, StudyContext, TrialFacts
from tuner.explain.whatif import WhatIf, best_of, parse_slo, what_if


def diagnose_rows(study_row, trial_rows, measurement_rows, ctx: StudyContext | None = None) -> dict[int, TrialDiagnosis]:
    """Trial number -> diagnosis, for one study's rows as tuner.storage.repo returns them."""
    ctx = ctx or StudyContext.of_study_row(study_row)
    by_trial: dict[int, list] = {}
    for m in measurement_rows:
        by_trial.setdefault(m.trial_number, []).append(LoadPoint.of(m))
    return {t.trial_number: diagnose_trial(TrialFacts.of(t), by_trial.get(t.trial_number, []), ctx)
            for t in trial_rows}


__all__ = ["Bound", "Cause", "Coverage", "Finding", "LoadPoint", "Metric", "PointDiagnosis", "StudyContext",
           "TrialDiagnosis", "TrialFacts", "WhatIf", "best_of", "diagnose_point", "diagnose_points",
           "diagnose_rows", "diagnose_trial", "parse_slo", "what_if"]
