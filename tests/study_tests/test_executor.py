"""The Ray executor starts a Ray of its own unless it is given a cluster's address."""

from __future__ import annotations

import pytest

from tuner.study import executor


@pytest.mark.parametrize("address,expected", [(None, "local"), ("10.0.0.1:6379", "10.0.0.1:6379")])
def test_ray_init_address(monkeypatch, address, expected):
    import ray

    seen = {}

    class Stop(Exception):
        pass

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    with pytest.raises(Stop):
        executor.RayExecutor(address)
    assert seen["address"] == expected, "never join whatever cluster this machine started last"
    assert seen["runtime_env"]["env_vars"]["PYTHONPATH"].split(":")[0] == executor._pythonpath().split(":")[0]
