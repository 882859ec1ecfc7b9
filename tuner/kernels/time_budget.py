"""A shape's device-time budget, shared over its batch sizes (no torch: the tuner and its replay use it)."""

from __future__ import annotations

from dataclasses import dataclass

# Of a batch size's time share: the joint search, then the down search; the rest re-times the leaders.
JOINT_TIME_FRACTION = 0.6
DOWN_TIME_FRACTION = 0.25


@dataclass(frozen=True)
class TimeShare:
    """One batch size's part of a shape's time budget (deadlines are ``time.monotonic()`` values)."""

    share_s: float
    joint_deadline: float
    down_deadline: float


def time_share(shape_time_s: float | None, spent_s: float, remaining: int, now: float, *,
               down: bool) -> TimeShare | None:
    """The next batch size's share of what is left of ``shape_time_s`` after ``spent_s``, with
    ``remaining`` batch sizes (this one included) still to tune; None without a time budget."""
    if not shape_time_s:
        return None
    share = max(0.0, shape_time_s - spent_s) / max(1, remaining)
    joint = JOINT_TIME_FRACTION if down else JOINT_TIME_FRACTION + DOWN_TIME_FRACTION
    return TimeShare(share, now + joint * share, now + (JOINT_TIME_FRACTION + DOWN_TIME_FRACTION) * share)
