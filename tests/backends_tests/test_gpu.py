"""NVML telemetry degrades to "no GPUs" on a machine without a driver (CI), never raising."""

import pytest

from tuner.backends import gpu


def test_without_nvml_everything_is_empty_not_an_error():
    if gpu.nvml_available():  # on a GPU machine the real path is exercised instead
        infos = gpu.detect_gpus(with_processes=True)
        assert infos and all(i.memory_total_mib > 0 for i in infos)
        return
    assert gpu.detect_gpus() == []
    assert gpu.nvml_error()
    assert gpu.memory_used_mib([0]) == {}
    assert gpu.wait_memory_released([0], [1], timeout_s=0.1)["released"] is None
    s = gpu.GPUSampler([0], interval_s=0.01).start()
    assert s.stop() == {"samples": 0, "interval_s": 0.01}


def test_utilization_over_one_load_point():
    s = gpu.GPUSampler([0, 1], interval_s=1.0)
    s.samples += [{"t_s": 0, "util_pct_0": 10, "util_pct_1": 20}]
    mark = s.mark()
    s.samples += [{"t_s": 1, "util_pct_0": 90, "util_pct_1": 50}, {"t_s": 2, "util_pct_0": 70, "util_pct_1": 30},
                  {"t_s": 3}]  # a sample NVML could not read
    u = s.utilization_since(mark)
    assert u == {"samples": 3, "interval_s": 1.0, "mean_utilization_pct": 60.0,
                 "per_gpu_mean_utilization_pct": {"0": 80.0, "1": 40.0}}
    assert s.utilization_since(s.mark()) is None  # nothing sampled since


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.nvml_available(), reason="needs NVML and a GPU")
def test_utilization_over_one_load_point_on_a_real_gpu():
    import time

    s = gpu.GPUSampler([0], interval_s=0.05).start()
    try:
        time.sleep(0.3)
        mark = s.mark()
        time.sleep(0.5)
        u = s.utilization_since(mark)
    finally:
        s.stop()
    assert u is not None and u["samples"] >= 3 and set(u["per_gpu_mean_utilization_pct"]) == {"0"}
    assert 0.0 <= u["mean_utilization_pct"] <= 100.0
