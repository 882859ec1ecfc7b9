"""The export check reaches its window the way the trial's load point did."""

from __future__ import annotations

import pytest

from tuner.config.schema import MeasurementSpec
from tuner.study.verify_export import replay_conditions


def test_a_point_recorded_with_its_warmup_is_replayed_with_it_not_with_the_studys_later_first_warmup():
    study = MeasurementSpec(warmup_s=20, first_warmup_s=45, duration_s=40)
    replay = replay_conditions(study, {"warmup_s": 20.0, "kernel_warmup": False})
    # the check's single load point is its server's first: without the override it would warm up 45 s
    assert study.warmup_for(0) == 45
    assert replay.warmup_for(0) == 20 and replay.warmup_for(3) == 20
    assert not replay.kernel_warmup and replay.duration_s == 40


def test_a_point_from_before_warmups_were_recorded_used_the_plain_warmup():
    study = MeasurementSpec(warmup_s=20, first_warmup_s=45, duration_s=40)
    assert replay_conditions(study, {"warmup_s": None}).warmup_for(0) == 20


def test_a_point_after_the_kernel_warmup_is_replayed_after_one():
    study = MeasurementSpec(warmup_s=20, duration_s=40)
    replay = replay_conditions(study, {"warmup_s": 45.0, "kernel_warmup": True})
    assert replay.kernel_warmup and replay.warmup_for(0) == 45
    assert not replay.fresh_kernels(0)


def test_a_point_measured_with_a_longer_window_is_replayed_with_its_own_window():
    # the study was resumed with --duration-s 160 after the point: the check replays the point's window
    later = MeasurementSpec(warmup_s=20, duration_s=40)
    assert replay_conditions(later, {"warmup_s": 20.0, "duration_s": 160.0}).duration_s == 160
    assert replay_conditions(later, {"warmup_s": 20.0, "duration_s": None}).duration_s == 40


def _summary():
    flags = {"quantization": "fp8", "enable-hierarchical-cache": True}
    point = {"users": 16, "p90_ttft_s": 0.3, "p90_tpot_s": 0.02, "valid": True, "step": 0}
    return {"name": "s", "trials": [
        {"number": 3, "status": "complete", "flags": flags, "knobs": {}, "measurements": [point]},
        {"number": 16, "status": "interrupted", "flags": dict(flags), "knobs": {}, "measurements": [point]},
        {"number": 17, "status": "interrupted", "flags": dict(flags), "knobs": {}, "measurements": []},
        {"number": 7, "status": "complete", "flags": {**flags, "quantization": None}, "knobs": {},
         "measurements": [point]}]}


def test_a_repeat_of_the_same_configuration_is_a_reference_even_when_it_was_interrupted():
    from tuner.study.verify_export import reference_trial

    s = _summary()
    assert reference_trial(s, s["trials"][0], None) is s["trials"][0]
    assert reference_trial(s, s["trials"][0], 16)["number"] == 16


@pytest.mark.parametrize("number, says", [(7, "flags that differ: quantization"), (17, "measured no load point"),
                                          (99, "no trial 99")])
def test_a_reference_of_another_configuration_or_without_points_is_refused_by_name(number, says):
    from tuner.errors import ConfigError
    from tuner.study.verify_export import reference_trial

    s = _summary()
    with pytest.raises(ConfigError) as e:
        reference_trial(s, s["trials"][0], number)
    assert says in str(e.value) and e.value.key == "--reference-trial"
