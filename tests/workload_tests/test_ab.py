"""Two measurement windows compared (tuner.workload.ab): verdicts, pairing, the between-servers spread."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ConfigError
from tuner.workload.ab import Verdict, compare_windows, read_requests, server_spread
from tuner.workload.metrics import RequestRecord

REPO = Path(__file__).resolve().parents[2]
TILES_AB = REPO / "results/h200-sglang/runs/h200-sglang-qwen3-tiles-ab"


def window(seed: int, *, tpot_scale: float = 1.0, ttft_scale: float = 1.0, sessions: int = 30,
           turns: int = 6, noise_seed: int | None = None) -> list[RequestRecord]:
    """Sessions whose requests draw TTFT and TPOT lognormally; ``seed`` decides which requests a
    window holds, ``noise_seed`` (default: seed) the per-request jitter."""
    rng = np.random.default_rng(seed)
    jitter = np.random.default_rng(seed if noise_seed is None else noise_seed)
    out = []
    for s in range(sessions):
        session_tpot = 0.02 * math.exp(rng.normal(0, 0.1))  # a session's context sets its pace
        for t in range(turns):
            ttft = ttft_scale * 0.2 * math.exp(rng.normal(0, 0.6) + jitter.normal(0, 0.05))
            tpot = tpot_scale * session_tpot * math.exp(jitter.normal(0, 0.05))
            n = 100
            out.append(RequestRecord(session_id=s, turn=t, start_s=0.0, input_tokens=1000, output_tokens=n,
                                     ttft_s=ttft, end_s=ttft + tpot * (n - 1)))
    return out


def by_metric(comparison):
    return {r.metric: r for r in comparison.intervals}


def test_a_window_against_itself_is_within_noise_at_ratio_one():
    w = window(1)
    got = by_metric(compare_windows(w, w, resamples=300))
    assert set(got) == {"p50_tpot_s", "p90_tpot_s", "p50_ttft_s", "p90_ttft_s", "paired_tpot"}
    for r in got.values():
        assert r.ratio == pytest.approx(1.0)
        assert r.low <= 1.0 <= r.high
        assert r.verdict is Verdict.WITHIN_NOISE


def test_a_real_slowdown_is_called_slower_and_a_speedup_faster():
    slow = by_metric(compare_windows(window(1), window(2, tpot_scale=1.25), resamples=400))
    fast = by_metric(compare_windows(window(1), window(2, tpot_scale=0.8), resamples=400))
    assert slow["p50_tpot_s"].verdict is Verdict.SLOWER and slow["p50_tpot_s"].low > 1
    assert fast["p50_tpot_s"].verdict is Verdict.FASTER and fast["p50_tpot_s"].high < 1
    # the same sessions and turns replayed: pairing sees the 20% whatever requests the window holds
    assert fast["paired_tpot"].ratio == pytest.approx(0.8, rel=0.03)


def test_two_windows_of_one_distribution_rarely_disagree():
    # the interval is a 90% one: of 20 A/A pairs of independent windows, most call it noise
    verdicts = [by_metric(compare_windows(window(i), window(100 + i), resamples=300))["p90_ttft_s"].verdict
                for i in range(20)]
    assert verdicts.count(Verdict.WITHIN_NOISE) >= 16


def test_pairing_tells_apart_a_change_the_p50s_cannot():
    a, b = window(1, noise_seed=10), window(1, tpot_scale=0.97, noise_seed=11)  # same requests, 3% faster
    got = by_metric(compare_windows(a, b, resamples=400))
    assert got["paired_tpot"].verdict is Verdict.FASTER
    assert got["paired_tpot"].high - got["paired_tpot"].low < got["p50_tpot_s"].high - got["p50_tpot_s"].low


def test_the_between_servers_spread_widens_every_interval_and_can_turn_a_verdict():
    base = compare_windows(window(1), window(2, tpot_scale=0.9), resamples=300)
    assert by_metric(base)["p50_tpot_s"].verdict is Verdict.FASTER
    wide = base.widened({"p50_tpot_s": 0.08})
    r0, r1 = by_metric(base)["p50_tpot_s"], by_metric(wide)["p50_tpot_s"]
    assert r1.ratio == r0.ratio and r1.low < r0.low and r1.high > r0.high and r1.server_sd == 0.08
    assert r1.verdict is Verdict.WITHIN_NOISE
    assert by_metric(wide)["p90_ttft_s"] == by_metric(base)["p90_ttft_s"]  # no spread given: unchanged


def test_server_spread_is_what_a_servers_offset_adds_beyond_the_window_noise():
    same = [compare_windows(window(i), window(i, noise_seed=50 + i), resamples=300) for i in range(3)]
    offset = [compare_windows(window(i), window(i, tpot_scale=1.1, noise_seed=50 + i), resamples=300)
              for i in range(3)]
    assert server_spread(same)["paired_tpot"] < 0.01
    # pairs 10% apart: d = log 1.1 each, so sd = d / sqrt(2) less a little window noise
    assert server_spread(offset)["paired_tpot"] == pytest.approx(math.log(1.1) / math.sqrt(2), rel=0.1)


def test_committed_tile_ab_windows_read_and_compare():
    a = read_requests(TILES_AB / "default/trial-0007/loadpoint-00-24u.requests.jsonl.gz")
    b = read_requests(TILES_AB / "tuned/trial-0007/loadpoint-00-24u.requests.jsonl.gz")
    assert len(a) > 200 and len(b) > 200
    got = by_metric(compare_windows(a, b, resamples=300))
    # fp8 Qwen3 at 24 users, tuned tiles: the same requests decode about 9% faster
    assert got["paired_tpot"].verdict is Verdict.FASTER and got["paired_tpot"].samples[0] > 200
    assert 0.85 < got["paired_tpot"].ratio < 0.95


@pytest.mark.parametrize("content, expect", [
    (None, "No such file"),
    (b"not json\n", "cannot read requests"),
    (json.dumps({"session_id": 1}).encode() + b"\n", "missing"),
    (b"\n", "no requests"),
])
def test_a_bad_requests_file_is_a_clear_error_naming_it(tmp_path, content, expect):
    path = tmp_path / "loadpoint-00-16u.requests.jsonl.gz"
    if content is not None:
        path.write_bytes(gzip.compress(content))
    with pytest.raises(ConfigError) as err:
        read_requests(path)
    assert str(path) in str(err.value) and expect in str(err.value)


def test_compare_windows_cli_prints_json_and_refuses_a_bad_file(tmp_path, capsys):
    from click.testing import CliRunner

    from tuner.cli import cli, main

    a = TILES_AB / "default/trial-0007/loadpoint-00-16u.requests.jsonl.gz"
    b = TILES_AB / "tuned/trial-0007/loadpoint-00-16u.requests.jsonl.gz"
    ok = CliRunner().invoke(cli, ["workload", "compare-windows", str(a), str(b), "--aa", str(a), str(a),
                                  "--resamples", "200", "--json"], catch_exceptions=False)
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert {"a", "b", "level", "aa_pairs", "server_sd", "ratios", "paired_tpot"} <= set(doc)
    assert doc["aa_pairs"] == 1 and doc["server_sd"]["paired_tpot"] == 0.0  # a window against itself
    assert {r["metric"] for r in doc["ratios"]} == {"p50_tpot_s", "p90_tpot_s", "p50_ttft_s", "p90_ttft_s"}
    with pytest.raises(SystemExit) as exc:
        main(["workload", "compare-windows", str(a), str(tmp_path / "missing.gz")])
    assert exc.value.code == 2 and "missing.gz" in capsys.readouterr().err
