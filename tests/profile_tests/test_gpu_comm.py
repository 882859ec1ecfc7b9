"""`tuner profile comm` on real GPUs with NCCL (run by hand on a GPU machine: `pytest -m gpu
tests/profile_tests/test_gpu_comm.py`). With one GPU the collectives are local copies: this checks
the tool end to end; with two or more it also checks that time grows with the message."""

import importlib.util

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")]


def test_every_collective_times_and_the_table_reads_back(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tuner.catalog import get_gpu
    from tuner.profile.comm import CommPlan, run_comm_profile
    from tuner.profile.runner import write_profile
    from tuner.sim.optable import COMM_OPS, load_profile

    gpus = min(2, torch.cuda.device_count())
    name = torch.cuda.get_device_name(0)
    gpu = next((g for g in ("h200", "h100", "b200") if get_gpu(g).torch_name.lower() in name.lower()), None)
    if gpu is None:
        pytest.skip(f"{name} is not a catalog GPU this test files tables under")
    plan = CommPlan(gpus=gpus, sizes_bytes=(4096, 1 << 20, 64 << 20), iters=5, repeats=3)
    doc = run_comm_profile(plan, gpu=gpu, expected_device_name=get_gpu(gpu).torch_name)
    pf = load_profile(write_profile(doc, tmp_path / "comm.json"))
    assert {t.op for t in pf.tables} == set(COMM_OPS)
    for t in pf.tables:
        assert all(v is not None and v > 0 for v in t.us) and t.shape == {"gpus": gpus, "nodes": 1}
        if gpus > 1:
            assert t.us[-1] > t.us[0]  # 64 MiB crosses the link slower than 4 KiB
    assert doc["provenance"]["nccl"] and doc["provenance"]["device_name_measured"] == name
