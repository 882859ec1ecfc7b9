"""measurement.first_warmup_s: only a deployment's first load point warms up longer."""

import pytest
from pydantic import ValidationError

from tuner.config.schema import MeasurementSpec


def test_the_first_load_point_takes_the_longer_warmup_and_later_ones_the_usual():
    m = MeasurementSpec(warmup_s=20, first_warmup_s=45, duration_s=40)
    assert [m.warmup_for(i) for i in range(3)] == [45.0, 20.0, 20.0]


def test_without_it_every_load_point_warms_up_alike_and_it_never_shortens_one():
    assert MeasurementSpec(warmup_s=20, duration_s=40).warmup_for(0) == 20.0
    assert MeasurementSpec(warmup_s=20, first_warmup_s=5, duration_s=40).warmup_for(0) == 20.0


def test_it_is_bounded_like_the_warmup():
    with pytest.raises(ValidationError):
        MeasurementSpec(warmup_s=20, first_warmup_s=-1, duration_s=40)
    with pytest.raises(ValidationError):
        MeasurementSpec(warmup_s=20, first_warmup_s=float("inf"), duration_s=40)


def test_only_a_first_load_point_without_the_kernel_warmup_meets_fresh_kernels():
    plain = MeasurementSpec(warmup_s=20, duration_s=40)
    assert plain.fresh_kernels(0) is True and plain.fresh_kernels(1) is False
    warmed = MeasurementSpec(warmup_s=20, duration_s=40, kernel_warmup=True)
    assert warmed.fresh_kernels(0) is False and warmed.fresh_kernels(3) is False
