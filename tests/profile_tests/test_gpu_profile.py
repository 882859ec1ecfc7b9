"""`tuner profile` with SGLang's own kernels on a real GPU (run by hand on a GPU machine with the
SGLang kit installed: `pytest -m gpu tests/profile_tests`)."""

import dataclasses
import importlib.util

import pytest

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                 or importlib.util.find_spec("sglang") is None, reason="needs torch and SGLang")]


def _catalog_gpu(device_name: str) -> str:
    """The catalog GPU this machine's is (profile run refuses to file one GPU's times under another)."""
    from tuner.catalog import gpus

    for name, g in gpus().items():
        if g.torch_name.lower() in device_name.lower():
            return name
    pytest.skip(f"no catalog GPU is a {device_name!r}")


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tuner.profile import build_plan
    from tuner.profile.modelcfg import write_model_dir
    from tuner.profile.sglang_kernels import SGLangKernels

    hardware = _catalog_gpu(torch.cuda.get_device_name(0))
    plan = build_plan("qwen3-30b-a3b", hardware, {"tp-size": 1, "attention-backend": "triton"}, quick=True)
    d = write_model_dir(plan.model, plan.ckpt, tmp_path_factory.mktemp("model"))
    return plan, SGLangKernels(plan.model, plan.gpu, model_dir=str(d), flags=plan.flags,
                               kv_cache_dtype=plan.kv_cache_dtype)


def test_every_operator_times_and_decode_attention_grows_with_context(kernels, tmp_path):
    from tuner.profile import CudaGraphTimer, run_profile, write_profile
    from tuner.sim.optable import load_profile

    plan, k = kernels
    small = dataclasses.replace(plan, tokens=(1, 64, 1024), batch=(1, 16), context=(1024, 16384),
                                new_tokens=(256, 2048), prefix=(0, 8192))
    doc = run_profile(small, k, CudaGraphTimer(repeats=5))
    pf = load_profile(write_profile(doc, tmp_path / "qwen.json"))
    assert {t.op for t in pf.tables} == {"gemm", "decode_attention", "extend_attention", "moe", "layer_misc",
                                         "sampling"}
    assert not doc["provenance"]["skipped_points"], doc["provenance"]["skipped_points"]
    dec = next(t for t in pf.tables if t.op == "decode_attention")
    assert dec.lookup_us(16, 16384) > dec.lookup_us(16, 1024) > 0
    moe = next(t for t in pf.tables if t.op == "moe")
    assert moe.lookup_us(1024) > moe.lookup_us(1) > 0


def test_a_hicache_backup_is_timed_on_the_host_and_grows_with_its_pages(kernels, tmp_path):
    from tuner.profile import CudaGraphTimer, build_plan, run_profile, write_profile
    from tuner.sim.optable import load_profile

    plan, k = kernels
    hw = dataclasses.replace(build_plan("qwen3-30b-a3b", plan.gpu.name, {**plan.flags, "kv-cache-dtype": "fp8_e4m3"},
                                        ops=("hicache_write",)), write_tokens=(64, 4096))
    doc = run_profile(hw, k, CudaGraphTimer(repeats=5))
    table = next(t for t in load_profile(write_profile(doc, tmp_path / "hw.json")).tables if t.op == "hicache_write")
    small, large = table.us
    assert 0 < small < large  # 8,192 page copies cost the thread more than 128
