"""Two servers' pure-decode steps at equal batch and context, from SGLang-format logs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_cli
from tests.sim_tests.synthetic_steplogs import write_decode_log as _log
from tuner.sim.decode_ab import compare_server_logs


def test_ratio_is_taken_at_equal_batch_and_context(tmp_path):
    c_a = {2: 5.0, 4: 6.0, 8: 8.0}
    c_b = {k: 0.9 * v for k, v in c_a.items()}  # B's context-free part 10% faster
    k = 0.05  # ms per thousand KV tokens
    pure_a = _log(tmp_path / "a.log", c_ms=c_a, k_ms_per_ktok=k, seed=1, windows=400,
         tokens_of=lambda b, r: b * r.uniform(2000, 4000))
    # B's traffic held 4x the context: its raw steps are slower although its kernels are faster
    _log(tmp_path / "b.log", c_ms=c_b, k_ms_per_ktok=k, seed=2, windows=400,
         tokens_of=lambda b, r: b * r.uniform(8000, 16000))
    c = compare_server_logs(tmp_path / "a.log", tmp_path / "b.log")
    raw = np.exp(np.mean([np.log(b.median_ratio) for b in c.batches]))
    assert raw > 1.0, "the raw medians say B is slower (its contexts are longer)"
    tokens = np.mean([(b.a_kv_tokens + b.b_kv_tokens) / 2 for b in c.batches])
    assert c.ratio < 1.0 and c.interval[0] <= c.ratio <= c.interval[1]
    # at the pooled context each batch's truth is (0.9 c + k t) / (c + k t)
    truth = np.mean([(0.9 * c_a[b.batch] + k * (b.a_kv_tokens + b.b_kv_tokens) / 2000)
                     / (c_a[b.batch] + k * (b.a_kv_tokens + b.b_kv_tokens) / 2000) for b in c.batches])
    assert c.ratio == pytest.approx(truth, abs=0.02) and tokens > 0
    assert c.kv_tokens_ratio > 3
    # every window with a prefill batch was left out
    assert sum(b.a_windows for b in c.batches) == pure_a > 50


def test_same_server_twice_is_one_and_disjoint_batches_give_none(tmp_path):
    _log(tmp_path / "a.log", c_ms={1: 4.0, 3: 5.0}, k_ms_per_ktok=0.05, seed=3,
         tokens_of=lambda b, r: b * r.uniform(2000, 4000))
    _log(tmp_path / "b.log", c_ms={1: 4.0, 3: 5.0}, k_ms_per_ktok=0.05, seed=4,
         tokens_of=lambda b, r: b * r.uniform(2000, 4000))
    _log(tmp_path / "c.log", c_ms={16: 9.0}, k_ms_per_ktok=0.05, seed=5, tokens_of=lambda b, r: 1000 * b)
    same = compare_server_logs(tmp_path / "a.log", tmp_path / "b.log")
    assert same.ratio == pytest.approx(1.0, abs=0.02) and same.interval[0] < 1.0 < same.interval[1]
    none = compare_server_logs(tmp_path / "a.log", tmp_path / "c.log")
    assert none.ratio is None and none.batches == []


def test_cli_prints_and_exits_1_without_common_batches(tmp_path):
    _log(tmp_path / "a.log", c_ms={2: 5.0}, k_ms_per_ktok=0.05, seed=6, tokens_of=lambda b, r: 3000 * b)
    _log(tmp_path / "b.log", c_ms={2: 6.0}, k_ms_per_ktok=0.05, seed=7, tokens_of=lambda b, r: 3000 * b)
    _log(tmp_path / "c.log", c_ms={8: 6.0}, k_ms_per_ktok=0.05, seed=8, tokens_of=lambda b, r: 3000 * b)
    r = run_cli(["kernels", "decode-steps", str(tmp_path / "a.log"), str(tmp_path / "b.log"), "--json"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["ratio"] == pytest.approx(1.2, abs=0.03) and doc["batches"][0]["batch"] == 2
    r = run_cli(["kernels", "decode-steps", str(tmp_path / "a.log"), str(tmp_path / "c.log")], cwd=tmp_path)
    assert r.returncode == 1 and "no batch size" in r.stdout
