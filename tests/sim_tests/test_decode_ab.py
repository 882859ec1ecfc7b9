"""Two servers' pure-decode steps at equal batch and context, from SGLang-format logs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_cli
from tuner.sim.decode_ab import compare_server_logs

START = 1_764_900_000  # epoch seconds


def _stamp(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _log(path, *, c_ms: dict[int, float], k_ms_per_ktok: float, tokens_of, seed: int, windows: int = 60,
         prefill_every: int = 4):
    """A log of decode windows (40 steps each) whose step is c[batch] + k x tokens, with a prefill batch
    (and a much slower window) every few windows."""
    rng = np.random.default_rng(seed)
    t, lines, pure, prev = float(START), [], 0, None
    for i in range(windows):
        batch = int(rng.choice(list(c_ms)))
        tokens = int(tokens_of(batch, rng))
        step_s = (c_ms[batch] + k_ms_per_ktok * tokens / 1000) / 1000 * rng.normal(1.0, 0.01)
        wall = 40 * step_s
        if i % prefill_every == 0:
            wall += 0.5
            lines.append(f"[{_stamp(t + wall / 2)}] Prefill batch, #new-seq: 1, #new-token: 2000, #cached-token: 0, "
                         f"token usage: 0.01, #running-req: {batch}, #queue-req: 0,")
        t += wall
        pure += i > 0 and batch == prev and i % prefill_every != 0
        prev = batch
        # the line ending a window carries that window's batch and throughput; the one before it
        # (ending the previous window) carries its batch at the window's start
        lines.append(f"[{_stamp(t)}] Decode batch, #running-req: {batch}, #token: {tokens}, token usage: 0.05, "
                     f"cuda graph: True, gen throughput (token/s): {40 * batch / wall:.2f}, #queue-req: 0")
    path.write_text("\n".join(lines) + "\n")
    return pure  # windows of one batch size without a prefill batch


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
