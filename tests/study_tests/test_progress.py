"""The live progress display's header: the best so far while trials end, the study's own best once
it ran (equal capacities are told apart by headroom to the SLO, which the display does not see)."""

from __future__ import annotations

from rich.console import Console

from tuner.lifecycle import TrialStatus
from tuner.study.progress import StudyProgress


def _header(progress: StudyProgress) -> str:
    console = Console(width=200, record=True)
    console.print(progress._render())
    return console.export_text().splitlines()[0]


def _end(progress: StudyProgress, number: int, capacity: int) -> None:
    progress.event("trial_end", {"number": number, "status": TrialStatus.COMPLETE, "capacity": capacity,
                                 "launched": True, "baseline": number == 0})


def test_the_header_shows_the_first_to_reach_a_capacity_then_the_studys_own_best():
    progress = StudyProgress("s", 4, enabled=False)
    for number, capacity in ((0, 32), (1, 80), (2, 64), (3, 80)):
        _end(progress, number, capacity)
    assert "best 80 users (trial 1)" in _header(progress) and "baseline 32" in _header(progress)
    progress.study_best(80, 3)  # the study picked trial 3: more headroom at 80 users
    assert "best 80 users (trial 3)" in _header(progress)
    progress.study_best(None, None)  # a study without a best leaves the display as it was
    assert "best 80 users (trial 3)" in _header(progress)


def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis_and_a_short_one_is_whole():
    progress = StudyProgress("s", 4, enabled=False)
    long = ("planner: HiCache needs 2023 GB of host memory but 80% of 2048 GB is 1638 GB: not enough host "
            "memory; give hicache-ratio 1.5 or less, or a node with more host memory than this one has")
    progress.event("trial_end", {"number": 1, "status": TrialStatus.INFEASIBLE, "reason": long,
                                 "failure_class": "infeasible", "launched": False})
    progress.event("trial_end", {"number": 2, "status": TrialStatus.INFEASIBLE, "reason": "planner: too small",
                                 "failure_class": "infeasible", "launched": False})
    cut, whole = progress.recent
    assert cut.endswith(" …)") and len(cut) < len(long)
    assert cut[:-3].split()[-1] in long.split()  # whole words only
    assert whole == "trial 2: infeasible (infeasible: planner: too small)"
