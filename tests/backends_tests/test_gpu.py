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


def test_clocks_over_one_load_point_name_the_slowdowns():
    s = gpu.GPUSampler([0], interval_s=1.0)
    s.samples += [{"t_s": 0, "sm_clock_mhz_0": 1980, "power_w_0": 90.0, "temp_c_0": 30, "clock_events_0": 0x1}]
    mark = s.mark()
    s.samples += [
        {"t_s": 1, "sm_clock_mhz_0": 1980, "max_sm_clock_mhz_0": 1980, "power_w_0": 600.0, "temp_c_0": 60, "clock_events_0": 0x0},
        {"t_s": 2, "sm_clock_mhz_0": 1600, "power_w_0": 700.0, "temp_c_0": 71, "clock_events_0": 0x4 | 0x20},
        {"t_s": 3, "sm_clock_mhz_0": 1700, "power_w_0": 690.0, "temp_c_0": 70, "clock_events_0": 0x4 | 0x1},
        {"t_s": 4, "sm_clock_mhz_0": 1780},  # power, temperature and reasons unreadable here
    ]
    c = s.clocks_since(mark)
    g = c["per_gpu"]["0"]
    assert c["samples"] == 4
    assert g["mean_sm_clock_mhz"] == 1765.0 and g["min_sm_clock_mhz"] == 1600 and g["max_sm_clock_mhz"] == 1980
    assert g["mean_busy_sm_clock_mhz"] == 1786.7  # the sample with the idle reason (0x1) left out
    assert g["mean_power_w"] == 663.3 and g["max_temperature_c"] == 71
    # the power cap in 2 of 3 readable samples, the software thermal slowdown in 1; idle (0x1) is no slowdown
    assert g["clock_limit_share"] == {"sw_power_cap": 0.667, "sw_thermal_slowdown": 0.333}
    assert gpu.clock_limits(0x1 | 0x2 | 0x100) == []
    assert s.clocks_since(s.mark()) is None


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.nvml_available(), reason="needs NVML and a GPU")
def test_clocks_are_read_on_a_real_gpu():
    import time

    s = gpu.GPUSampler([0], interval_s=0.05).start()
    try:
        mark = s.mark()
        time.sleep(0.4)
        c = s.clocks_since(mark)
    finally:
        s.stop()
    g = c["per_gpu"]["0"]
    assert c is not None and 100 < g["mean_sm_clock_mhz"] <= g["max_sm_clock_mhz"]


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
