"""The tile A/B's per-variant loop: an interrupted tuned variant keeps its load points and its proof.

The whole command runs against a real (simulated) server in
tests/backends_tests/test_sglang_study.py; this covers what a real GPU call showed: the call's limit
(SIGINT) cut the tuned variant after its first point, and the proof that SGLang had loaded our
files was never made, although its log held it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.study.tiles_ab import TilesAB, VariantRun, _serve_variant

UP = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


@dataclass
class _Point:
    users: int
    p90_tpot_s: float = 0.02
    p90_ttft_s: float = 0.3
    throughput_tokens_per_s: float = 400.0

    def to_dict(self) -> dict:
        return {"users": self.users, "p90_tpot_s": self.p90_tpot_s, "valid": True}


class _Deployment:
    """Stands in for a started server: its log names our file; the second load point is interrupted."""

    def __init__(self, tmp_path: Path, interrupt_at: int):
        moe = tmp_path / "moe"
        self.log_path = str(tmp_path / "sglang0.log")
        Path(self.log_path).write_text(
            f"[2026-12-03 17:31:06] Using MoE kernel config from {moe}/configs/triton_3_6_0/{UP}.\n")
        self.plan = SimpleNamespace(facts={"tile_files_expected": [UP]}, files={"moe_config_dir": str(moe)})
        self.interrupt_at, self.closed = interrupt_at, False

    def measure(self, users: int) -> _Point:
        if users == self.interrupt_at:
            raise KeyboardInterrupt
        return _Point(users)

    def telemetry(self) -> dict:
        return {"ready_after_s": {"0": 66.0}}

    def close(self) -> None:
        self.closed = True


def test_an_interrupted_tuned_variant_keeps_its_point_and_its_proof(tmp_path):
    ab = TilesAB(study="s", trial_number=5, users=[8, 16])
    run = VariantRun(tiles="tuned", load_points=[], server_ready_s=None, log_path=None)
    ab.variants.append(run)
    seen: list[dict] = []
    deployment = _Deployment(tmp_path, interrupt_at=16)
    with pytest.raises(KeyboardInterrupt):
        _serve_variant(ab, run, deployment, [8, 16], say=lambda msg: None,
                       on_point=lambda a: seen.append(a.to_dict()))
    assert deployment.closed
    assert [p["users"] for p in run.load_points] == [8]
    assert run.tiles_loaded is True and ab.proven
    # the last document the caller was given (what the call brings back) holds the proof
    assert seen[-1]["tuned_tiles_proven_loaded"] is True


def test_a_default_variant_is_not_proven_and_a_finished_one_records_its_ready_time(tmp_path):
    ab = TilesAB(study="s", trial_number=5, users=[8])
    run = VariantRun(tiles="default", load_points=[], server_ready_s=None, log_path=None)
    ab.variants.append(run)
    _serve_variant(ab, run, _Deployment(tmp_path, interrupt_at=-1), [8], say=lambda msg: None, on_point=None)
    assert run.tiles_loaded is None and run.server_ready_s == 66.0 and not ab.proven


def test_an_ab_becomes_probe_files_the_fidelity_benchmark_reads_as_its_study_would(tmp_path):
    """A committed A/B (call 30, DeepSeek-shaped, random weights) as probe files: the study's
    configuration, random-weight routing, seeds and fresh-server marks as the study's own points get."""
    import json

    from tuner.catalog.hf import ModelRef
    from tuner.sim.measured import points_from_database, points_from_probe
    from tuner.study.export import _pick
    from tuner.study.runner import load_existing
    from tuner.study.summary import study_summary
    from tuner.study.tiles_ab import probe_documents, write_probes

    here = Path(__file__).resolve().parents[2] / "results" / "h200-sglang"
    storage = f"sqlite:///{here / 'h200-sglang-dsv3.db'}"
    ab = json.loads((here / "calls/30-dsv3-tiles-ab-16-users/tiles-ab.json").read_text())
    spec = load_existing(storage, ab["study"], notes=[])
    trial = _pick(study_summary(storage, ab["study"]), ab["trial_number"])
    paths = write_probes(probe_documents(ab, spec, trial), tmp_path)
    assert sorted(paths) == ["default", "tuned"]
    study_point = next(p for p in points_from_database(here / "h200-sglang-dsv3.db") if p.trial == 5)
    for tiles, path in paths.items():
        (point,) = points_from_probe(Path(path))
        assert isinstance(point.model, ModelRef) and point.model.overrides == {"num_hidden_layers": 8}
        assert point.flags == study_point.flags and point.flags["load-format"] == "dummy"
        assert point.knobs["moe-tile-configs"] == tiles
        assert point.seed == spec.seed + 5 and point.fresh_server  # its server's first point, no kernel warm-up
        assert point.users == 16 and point.measured["p90_tpot_s"] == ab["comparison"][0][tiles]["p90_tpot_s"]
        assert point.workload.name == study_point.workload.name
        # the window's own P90 intervals travel with it (the fidelity benchmark's marginal verdicts)
        variant = next(v for v in ab["variants"] if v["tiles"] == tiles)
        assert point.p90_spread == {k: tuple(v) for k, v in variant["load_points"][0]["extra"]["p90_spread"].items()}


def test_a_probe_with_a_bad_model_mapping_names_the_key(tmp_path):
    import json

    from tuner.errors import ConfigError
    from tuner.sim.measured import points_from_probe

    path = tmp_path / "x.probe.json"
    path.write_text(json.dumps({"format": "tuner-probe/1", "model": {"nme": "qwen3-30b-a3b"}, "gpu": "h200",
                                "flags": {}, "slo": {"p90_ttft_s": 1, "p90_tpot_s": 0.05},
                                "workload": "coding-agent-40k",
                                "points": [{"users": 4, "duration_s": 40, "measured": {"p90_ttft_s": 1, "p90_tpot_s": 0.02}}]}))
    with pytest.raises(ConfigError) as err:
        points_from_probe(path)
    assert err.value.key == "model" and str(path) in str(err.value)


def _window_run(tmp_path, name: str, tiles: str, repeat: int, records) -> VariantRun:
    """A served variant whose one load point (16 users) left its request file beside its log."""
    import dataclasses
    import gzip
    import json

    d = tmp_path / name
    d.mkdir()
    with gzip.open(d / "loadpoint-00-16u.requests.jsonl.gz", "wt") as f:
        for r in records:
            f.write(json.dumps(dataclasses.asdict(r)) + "\n")
    point = {"users": 16, "p90_tpot_s": 0.02, "p90_ttft_s": 0.3, "throughput_tokens_per_s": 400.0, "valid": True,
             "extra": {"requests_file": "loadpoint-00-16u.requests.jsonl.gz"}}
    return VariantRun(tiles=tiles, load_points=[point], server_ready_s=60.0, log_path=str(d / "sglang0.log"),
                      repeat=repeat)


def test_a_variant_served_twice_is_an_aa_pair_whose_spread_widens_the_ab(tmp_path):
    from tests.workload_tests.test_ab import window

    default, tuned = _window_run(tmp_path, "d", "default", 1, window(1)), \
        _window_run(tmp_path, "t", "tuned", 1, window(1, tpot_scale=0.95, noise_seed=7))
    # the second default server is 6% slower than the first: a servers' spread the windows do not show
    again = _window_run(tmp_path, "d2", "default", 2, window(1, tpot_scale=1.06, noise_seed=9))
    assert again.name == "default-2"
    plain = TilesAB(study="s", trial_number=0, users=[16], variants=[default, tuned])
    aa = TilesAB(study="s", trial_number=0, users=[16], variants=[default, tuned, again])
    (row0,), (row1,) = plain.comparison(), aa.comparison()
    assert "same_tiles" not in row0 and plain.server_spread() == {}
    pair = row1["same_tiles"]["default-2/default"]["paired_tpot"]
    assert pair["ratio"] == pytest.approx(1.06, rel=0.02) and pair["verdict"] == "slower"
    assert aa.server_spread()["paired_tpot"] > 0.03
    before, after = row0["intervals"]["paired_tpot"], row1["intervals"]["paired_tpot"]
    assert before["verdict"] == "faster" and after["ratio"] == before["ratio"]
    assert after["low"] < before["low"] and after["high"] > before["high"] and after["verdict"] == "within noise"
    # tuned / default is still the first server of each
    assert row1["tuned_over_default"] == row0["tuned_over_default"]


def test_the_servers_logs_give_the_decode_steps_at_equal_batch_and_context(tmp_path):
    from tests.sim_tests.test_decode_ab import _log
    from tests.workload_tests.test_ab import window

    default, tuned = _window_run(tmp_path, "d", "default", 1, window(1)), \
        _window_run(tmp_path, "t", "tuned", 1, window(1, tpot_scale=0.95, noise_seed=7))
    ab = TilesAB(study="s", trial_number=0, users=[16], variants=[default, tuned])
    assert ab.to_dict()["decode_steps"] == {}  # no server log: nothing to say
    tokens = lambda b, r: b * r.uniform(2000, 4000)
    _log(tmp_path / "d" / "sglang0.log", c_ms={2: 5.0, 4: 6.0}, k_ms_per_ktok=0.05, seed=1, windows=200, tokens_of=tokens)
    _log(tmp_path / "t" / "sglang0.log", c_ms={2: 4.5, 4: 5.4}, k_ms_per_ktok=0.05, seed=2, windows=200, tokens_of=tokens)
    steps = ab.to_dict()["decode_steps"]
    assert list(steps) == ["tuned/default"]
    assert steps["tuned/default"]["ratio"] == pytest.approx(0.91, abs=0.02)
    assert steps["tuned/default"]["paired_windows"] > 20
