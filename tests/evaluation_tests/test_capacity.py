import pytest

from tuner.evaluation.capacity import CapacitySearch


def run(true_capacity, **kw):
    s = CapacitySearch(**{"start_users": 16, "max_users": 256, "resolution_users": 2, **kw})
    while not s.done:
        u = s.next_users()
        s.record(u, u <= true_capacity)
    return s


@pytest.mark.parametrize("true_capacity", [1, 5, 16, 17, 37, 50, 99, 200, 255])
def test_finds_capacity_within_resolution(true_capacity):
    s = run(true_capacity)
    assert s.capacity_users <= true_capacity
    assert true_capacity - s.capacity_users < 2
    assert len(s.steps) <= 12


def test_zero_when_even_one_user_misses():
    s = run(0)
    assert s.capacity_users == 0
    assert s.steps[-1] == (1, False)


def test_stops_at_max_users():
    s = run(10_000)
    assert s.capacity_users == 256
    assert [u for u, _ in s.steps] == [16, 32, 64, 128, 256]


def test_gallops_then_bisects():
    s = run(50)
    users = [u for u, _ in s.steps]
    assert users[:3] == [16, 32, 64]  # gallop
    assert all(32 < u < 64 for u in users[3:])  # bisect inside the bracket


def test_upper_bound_shrinks_after_a_miss():
    s = CapacitySearch(start_users=16, max_users=256)
    assert s.upper_bound() == 256
    s.record(16, True)
    s.record(32, False)
    assert s.upper_bound() == 31 and s.next_users() == 24
