"""HiCache load-back measured from SGLang's /metrics (`tuner calibration host-link`)."""

import dataclasses
import json

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.sim.hostlink import SECONDS_KEY, TOKENS_KEY, load_back_samples, pooled_efficiency
from tuner.sim.measured import points_from_database
from tests.conftest import REPO

H100_DB = REPO / "results" / "h100-sglang" / "h100-sglang-qwen3.db"


def _h100_points():
    return {p.label: p for p in points_from_database(H100_DB)}


def test_rates_come_from_the_servers_own_counters_and_the_planners_kv_cell():
    points = _h100_points()
    samples = {s.label: s for s in load_back_samples(points.values())}
    # only trial 5 (HiCache over a 128 k-token device pool) loaded back; trials 1 and 2 never evicted
    assert set(samples) == {"h100-sglang-qwen3#5@24", "h100-sglang-qwen3#5@32"}
    s = samples["h100-sglang-qwen3#5@32"]
    sm = points["h100-sglang-qwen3#5@32"].server_metrics
    assert s.tokens == int(sm[TOKENS_KEY]) and s.seconds == sm[SECONDS_KEY]
    # Qwen3-30B-A3B, fp8 KV: 48 layers x 4 KV heads x 128 dims x (K, V) x 1 byte
    assert s.kv_cache_dtype == "fp8_e4m3" and s.kv_bytes_per_token == 48 * 4 * 128 * 2
    assert s.gbps == pytest.approx(s.tokens * 49_152 / s.seconds / 1e9)
    assert s.efficiency == pytest.approx(s.gbps / 55)


def test_the_pooled_share_weights_each_point_by_its_traffic():
    pts = _h100_points()
    a, b = load_back_samples(pts.values())
    small = dataclasses.replace(a, tokens=10_000, seconds=1.0)  # a slow, small point barely moves the pool
    pooled = pooled_efficiency([b, small])
    assert b.efficiency > pooled > small.efficiency
    assert pooled == pytest.approx((b.tokens + 10_000) * 49_152 / ((b.seconds + 1.0) * 55e9))


def test_small_load_backs_are_left_out_and_no_data_is_an_error():
    pts = list(_h100_points().values())
    assert len(load_back_samples(pts, min_tokens=100_000)) == 1  # only #5@32 moved more than 100 k tokens
    with pytest.raises(ConfigError, match="load_back_tokens_total"):
        pooled_efficiency(load_back_samples(pts, min_tokens=10**9))


def test_the_command_prints_the_figure_and_the_calibrations_value(tmp_path):
    res = CliRunner().invoke(cli, ["calibration", "host-link", "--results", str(H100_DB), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["points"]) == 2 and 0.2 < doc["pooled_efficiency"] < 0.5
    assert doc["calibration_host_link_efficiency"]["h100"] == pytest.approx(0.35)
    text = CliRunner().invoke(cli, ["calibration", "host-link", "--results", str(H100_DB)])
    assert text.exit_code == 0 and "of the host link" in text.output
    empty = CliRunner().invoke(cli, ["calibration", "host-link", "--results", str(tmp_path)])
    assert empty.exit_code != 0
