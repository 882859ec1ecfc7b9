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
