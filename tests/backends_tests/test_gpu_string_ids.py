"""NVML telemetry with GPU ids given as strings (Ray and CUDA_VISIBLE_DEVICES give "0")."""

from __future__ import annotations

import types

import pytest

from tuner.backends import gpu


@pytest.fixture
def fake_nvml(monkeypatch):
    state = {"used_mib": 9000}

    def handle(index):
        if not isinstance(index, int):
            raise TypeError("an integer is required")  # what ctypes' c_uint says to "0"
        return index

    nv = types.SimpleNamespace(
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=state["used_mib"] * 2**20, total=143771 * 2**20),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
    )
    monkeypatch.setattr(gpu, "_nvml", lambda: nv)
    monkeypatch.setattr(gpu, "nvml_available", lambda: True)
    return state


def test_memory_of_string_ids(fake_nvml):
    assert gpu.memory_used_mib(["0"]) == {"0": 9000}


def test_release_waits_for_memory_back_near_the_pre_start_figure(fake_nvml):
    out = gpu.wait_memory_released(["0"], [123], timeout_s=0.2, baseline_mib={"0": 1235})
    assert out["released"] is False and out["over_baseline_mib"] == {"0": 9000}
    fake_nvml["used_mib"] = 1300  # within the 1 GiB slack
    out = gpu.wait_memory_released(["0"], [123], timeout_s=0.2, baseline_mib={"0": 1235})
    assert out["released"] is True and out["used_mib"] == {"0": 1300}
