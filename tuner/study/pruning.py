"""Pruning: stop a trial's capacity search once it cannot beat the incumbent.

After each load point the capacity search knows an interval [capacity_users, upper_bound()]
for the trial's capacity. Once ``upper_bound()`` is no higher than the best capacity any finished
trial reached, the remaining load points cannot change which configuration is best: the trial is
stopped, recorded as ``pruned`` with its lower bound, and Optuna is told that lower bound (it is
at most the incumbent, so the sampler ranks the configuration below it either way). The baseline
is never pruned: its capacity is the reference every improvement is quoted against.
"""

from __future__ import annotations

from tuner.evaluation.capacity import CapacitySearch
from tuner.vocabulary import Bisection


def should_prune(search: CapacitySearch, incumbent_users: int | None) -> bool:
    """True when the search is unfinished and its best possible result cannot exceed the incumbent."""
    if incumbent_users is None or incumbent_users <= 0 or search.done:
        return False
    return search.upper_bound() <= incumbent_users


def prune_reason(search: CapacitySearch, incumbent_users: int) -> str:
    return (f"stopped early: capacity is between {search.capacity_users} and {search.upper_bound()} users, "
            f"not above the best so far ({incumbent_users})")


def replay_pruned(study, steps: list, incumbent_users: int | None) -> tuple[int, int, bool]:
    """Replay a recorded capacity search (``[(users, passed), ...]``) with pruning against
    ``incumbent_users``: returns (load points measured, capacity or lower bound, pruned?)."""
    # verdicts alone: the steps a table recorded (tuner.bench.table)
    search = CapacitySearch.for_study(study, bisect=Bisection.MIDPOINT)
    for i, (users, passed) in enumerate(steps):
        expected = search.next_users()
        if expected != users:  # a table made with other capacity settings: no replay possible
            raise ValueError(f"recorded step {i} measured {users} users, the search would measure {expected}")
        search.record(users, bool(passed))
        if should_prune(search, incumbent_users):
            return i + 1, search.capacity_users, True
    return len(steps), search.capacity_users, False
