"""Without Ray, GPU trials still get their GPU ids (NVML telemetry and the release check need them)
and the teardown report reaches the recorded telemetry."""

from __future__ import annotations

from tuner.study import executor


def test_local_gpu_ids_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert executor._local_gpu_ids(1) == ["3"]
    assert executor._local_gpu_ids(2) == ["3", "5"]
    assert executor._local_gpu_ids(4) == ["3", "5"]  # fewer exist: the backend reports it
    assert executor._local_gpu_ids(0) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert executor._local_gpu_ids(1) == []


def test_local_gpu_ids_from_nvml_when_unset(monkeypatch):
    from tuner.backends import gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu, "detect_gpus", lambda with_processes=False: [
        gpu.GPUInfo(index=i, name="NVIDIA H200", uuid=f"GPU-{i}", memory_total_mib=143771, memory_used_mib=0,
                    utilization_pct=0) for i in range(2)])
    assert executor._local_gpu_ids(1) == ["0"]


class _Deployment:
    def __init__(self):
        self.close_report = {}

    def telemetry(self):
        return {"backend": "fake", "close": self.close_report}

    def close(self):
        self.close_report = {"gpu_release": {"released": True, "used_mib": {"0": 1235}}}


def test_in_process_worker_gets_gpu_ids_and_records_the_teardown(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    ex = executor.InProcessExecutor()
    ex.submit(7, "close", num_gpus=1)
    worker = ex._workers[7]
    assert worker._gpu_ids == ["0"]
    worker._deployment = _Deployment()
    [res] = ex.wait()
    assert res.ok and res.value["close"]["gpu_release"]["released"] is True  # filled by close(), not before
    ex.submit(8, "close", num_gpus=0)
    assert ex._workers[8]._gpu_ids == []
