"""The compile pool's reuse of one binary across the batch sizes of a specialisation class."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from tuner.kernels import sglang_compile as sc


def _pool(kind, monkeypatch, compiled):
    def fake_compile(task):
        compiled.append(task)
        M, cfg = task
        return sc.CompileResult(task, cfg != "bad", 1.0, None if cfg != "bad" else "OutOfResources")

    monkeypatch.setattr(sc, "_compile", fake_compile)
    pool = sc.SGLangCompilePool.__new__(sc.SGLangCompilePool)
    pool.workers, pool.kind, pool.results, pool._by_class = 1, kind, {}, {}
    pool.reused, pool.compile_wall_s = 0, 0.0
    pool._pool = ThreadPoolExecutor(max_workers=1)
    return pool


@pytest.mark.parametrize("M, cls", [(1, (True, False)), (4, (False, False)), (16, (False, True)),
                                    (2048, (False, True)), (24, (False, False))])
def test_gemm_class_is_value_one_and_divisibility_by_16(M, cls):
    assert sc.specialization_class("gemm", M) == cls


def test_moe_keeps_every_batch_size_apart():
    assert sc.specialization_class("moe", 32) != sc.specialization_class("moe", 64)


def test_gemm_compiles_a_config_once_per_class(monkeypatch):
    compiled = []
    pool = _pool("gemm", monkeypatch, compiled)
    pool.ensure([(16, "a"), (16, "bad")])
    pool.ensure([(32, "a"), (2048, "bad"), (1, "a"), (4, "a")])
    # 32 and 2048 share 16's binaries; 1 and 4 are classes of their own
    assert sorted(compiled) == sorted([(16, "a"), (16, "bad"), (1, "a"), (4, "a")])
    assert pool.reused == 2
    assert pool.failed(2048, "bad") == "OutOfResources"  # a failure carries over to the class
    assert pool.failed(32, "a") is None and (32, "a") in pool.results


def test_moe_compiles_each_batch_size(monkeypatch):
    compiled = []
    pool = _pool("moe", monkeypatch, compiled)
    pool.ensure([(16, "a")])
    pool.ensure([(32, "a")])
    assert sorted(compiled) == [(16, "a"), (32, "a")] and pool.reused == 0


def _em_class(n, E, block_m):
    em = sc.sort_length(n, E, block_m)
    return em == 1, em % 16 == 0


@pytest.mark.parametrize("E, topk, shared", [(257, 9, 1), (128, 8, 0), (64, 6, 0), (160, 8, 0), (33, 3, 1),
                                             (16, 4, 0), (384, 8, 0), (72, 8, 1)])
def test_a_stand_in_keeps_the_kernels_integer_specialisation(E, topk, shared):
    for M in (1, 2, 3, 4, 7, 16, 28, 29, 32, 48, 64, 128, 512, 4096):
        e = sc.stand_in_experts(E, topk, shared, M)
        assert max(topk, shared + 1) <= e <= E and e % 16 == E % 16
        n = M * topk
        assert (n < e + 1) == (n < E + 1)  # the same branch of moe_align_block_size
        for block_m in (16, 32, 64, 128, 256):
            assert _em_class(n, e, block_m) == _em_class(n, E, block_m), (M, block_m, e)


def test_deepseek_v3s_compile_processes_hold_far_fewer_experts():
    from tuner.kernels.shapes import MoEShape

    shape = MoEShape(257, 2048, 7168, 9, "fp8_w8a8", (128, 128), fused_shared_experts=1)
    got = {M: sc.compile_stand_in(shape, M).num_experts for M in (1, 4, 16, 32, 4096)}
    assert got == {1: 17, 4: 49, 16: 145, 32: 17, 4096: 17}
    assert sc.moe_stand_in_bytes(shape, [32, 4096]) == 17 * 3 * 2048 * 7168
    ep = MoEShape(128, 768, 2048, 8, "bf16", ep_size=2)
    assert sc.compile_stand_in(ep, 64) is ep  # expert parallelism keeps the whole shape
