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
