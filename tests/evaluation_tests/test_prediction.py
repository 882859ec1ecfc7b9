"""The simulator's predicted capacity runs the study's own capacity search, P90s included."""

import math
from types import SimpleNamespace

import pytest

from tuner.config.schema import CapacitySpec
from tuner.evaluation import prediction


def _study(bisect):
    return SimpleNamespace(capacity=CapacitySpec(start_users=16, max_users=256, resolution_users=4, bisect=bisect),
                           slo=SimpleNamespace(p90_ttft_s=30.0, p90_tpot_s=0.05),
                           measurement=SimpleNamespace(duration_s=60, warmup_for=lambda i: 10,
                                                       fresh_kernels=lambda i: False))


@pytest.mark.parametrize("bisect", ["midpoint", "interpolate"])
def test_predicted_capacity_searches_as_the_study_does(monkeypatch, bisect):
    asked = []

    def predict(study, flags, knobs, users, **kw):  # P90 TPOT crossing 50 ms at 45.5 users
        asked.append(users)
        tpot = 0.05 * math.exp(0.04 * (users - 45.5))
        return {"p90_ttft_s": 1.0, "p90_tpot_s": tpot, "meets_slo": tpot <= 0.05, "calibration": []}

    monkeypatch.setattr(prediction, "predict", predict)
    users, basis = prediction.predicted_capacity(_study(bisect), {}, {}, seed=0)
    assert 41 < users <= 45 and "simulator's capacity" in basis
    expected = {"midpoint": [16, 32, 64, 48, 40, 44], "interpolate": [16, 32, 64, 46, 42]}
    assert asked == expected[bisect]
