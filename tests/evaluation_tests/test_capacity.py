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


def guided(guess, true_capacity, **kw):
    s = CapacitySearch(**{"start_users": guess, "max_users": 256, "resolution_users": 8, "guided": True, **kw})
    while not s.done:
        u = s.next_users()
        s.record(u, u <= true_capacity)
    return s


@pytest.mark.parametrize("guess", [8, 24, 40])
def test_a_guided_search_brackets_a_right_guess_in_two_load_points(guess):
    s = guided(guess, guess)
    assert s.steps == [(guess, True), (guess + 8, False)]
    assert s.capacity_users == guess


def test_a_guided_search_steps_down_by_the_resolution_when_the_guess_misses():
    s = guided(24, 16)
    assert s.steps == [(24, False), (16, True)]


@pytest.mark.parametrize("guess", [1, 8, 30, 64, 200])
@pytest.mark.parametrize("true_capacity", [0, 3, 16, 37, 99, 255])
def test_a_guided_search_finds_capacity_within_resolution_from_any_guess(guess, true_capacity):
    s = guided(guess, true_capacity)
    assert s.capacity_users <= true_capacity
    assert true_capacity - s.capacity_users < 8 or s.capacity_users == 256
    assert len(s.steps) <= 12
    # stepping out from the guess, the steps grow (8, 16, 32...) until the bracket is found
    out = []
    for u, passed in s.steps:
        if out and passed != s.steps[0][1]:
            break
        out.append(u)
    if out[-1] in (1, 256):  # the last step was clamped at a bound
        out = out[:-1]
    gaps = [abs(b - a) for a, b in zip(out, out[1:])]
    assert gaps == [8 * 2 ** i for i in range(len(gaps))]


def test_a_guided_search_that_fails_everywhere_ends_at_the_smallest_load():
    s = guided(24, 0)
    assert s.capacity_users == 0 and s.steps[-1] == (1, False)


def test_for_study_takes_a_prediction_as_a_guided_start(tmp_path):
    from tests.study_tests.fakes import tiny_study

    study = tiny_study(tmp_path, max_users=64)
    plain = CapacitySearch.for_study(study)
    assert (plain.next_users(), plain.guided) == (4, False)
    s = CapacitySearch.for_study(study, predicted_users=500)  # clamped to the study's max_users
    assert (s.next_users(), s.guided) == (64, True)
