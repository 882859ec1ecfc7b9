"""The SGLang tuning flow on the CPU: fake timer, pool and problem stand in for the GPU parts."""

from __future__ import annotations

import gzip
import json
import math
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.kernels.configfile import read_configs
from tuner.kernels.shapes import moe_shape
from tuner.kernels.space import DownTileConfig, TileConfig


def _cost(M, cfg) -> float:
    """A smooth fake: best near BM=16 (small M) / 64 (large M), BN 128, 4 warps, 3 stages; TMA helps down."""
    if isinstance(cfg, tuple):
        up, down = cfg
        d = down if down is not None else DownTileConfig.from_tile(up)
        return _one(M, up) * 0.5 + _one(M, d.tile) * 0.5 * (0.9 if d.USE_TMA else 1.0)
    return _one(M, cfg)


def _one(M, c) -> float:
    bm_best = 16 if M <= 64 else 64
    return (100 + 10 * abs(math.log2(c.BLOCK_SIZE_M / bm_best)) + 5 * abs(math.log2(c.BLOCK_SIZE_N / 128))
            + 2 * abs(c.num_warps - 4) + 1.5 * abs(c.num_stages - 3) + 0.1 * c.GROUP_SIZE_M / 16) * (1 + M / 1024)


class _Timer:
    def __init__(self, problem, **kw):
        self.first_failure = None
        self.measured = 0

    def measure(self, M, cfg, cutoff_us=None, replays=None):
        self.measured += 1
        return _cost(M, cfg)

    def wall_snapshot(self):
        return {"eager": 0.0, "capture": 0.0, "replay": 0.0, "measured": self.measured}


class _Pool:
    def __init__(self, *a, **kw):
        self.compile_wall_s = 0.0
        self.reused = 0
        self.tasks = []

    def ensure(self, tasks, on_done=None):
        self.tasks += list(tasks)

    def failed(self, M, cfg):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _Problem:
    def __init__(self, shape, **kw):
        import types as _t

        self.w1 = _t.SimpleNamespace(numel=lambda: 1, element_size=lambda: 1)

    def drop_batch(self, M):
        pass


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    # the part of SGLang 0.5.17's package the flow reads: its version and the H200 tile files it ships
    ref = Path(__file__).parent / "data" / "sglang-0.5.17" / "sglang"
    from tuner.kernels.sglang_env import sglang_at

    installed = sglang_at(ref)
    rt = types.SimpleNamespace(layout=installed.layout, installed=installed, version="0.5.17", tma_supported=True)
    timing = types.ModuleType("tuner.kernels.timing")
    timing.GraphTimer = _Timer
    timing.time_or_inf = lambda timer, M, cfg, **kw: timer.measure(M, cfg, **kw)
    timing.device_facts = lambda: {"device_name": "NVIDIA H200", "triton_version": "3.6.0", "torch_version": "2.11",
                                   "sm_version": 90, "smem_limit_bytes": 232448}
    from tuner.kernels import sglang_compile as real_compile  # stdlib-only at import: the CPU pure parts

    comp = types.ModuleType("tuner.kernels.sglang_compile")
    comp.SGLangCompilePool = _Pool
    comp.workers_for = lambda *a, **kw: 8
    comp.moe_stand_in_bytes = real_compile.moe_stand_in_bytes
    kern = types.ModuleType("tuner.kernels.sglang_kernels")
    kern.SGLangMoE = _Problem
    kern.runtime = lambda: rt
    triton = types.ModuleType("triton")
    triton.__version__ = "3.6.0"
    for name, mod in (("tuner.kernels.timing", timing), ("tuner.kernels.sglang_compile", comp),
                      ("tuner.kernels.sglang_kernels", kern), ("triton", triton)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    return rt


def test_moe_flow_writes_up_and_down_files_and_resumes(fake_gpu, tmp_path):
    from tuner.kernels.sglang_tune import tune_moe

    shape = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    out = tmp_path / "out"
    rep = tune_moe(shape, [1, 256], out, budget=40, down_budget=20, log=lambda m: None)
    assert rep["complete"] and [r["batch_size"] for r in rep["rows"]] == [1, 256]
    up = read_configs(out / "configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json")
    down = read_configs(out / "configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200_down.json")
    for M in (1, 256):
        assert down[M]["BLOCK_SIZE_M"] == up[M]["BLOCK_SIZE_M"]  # one shared sort
        assert "USE_TMA" not in up[M] and "USE_TMA" in down[M]  # 0.5.17 breaks on USE_TMA in an up file
    row = rep["rows"][0]
    # the shipped H200 bf16 file is the baseline; the tuned pair is never slower than what was picked
    assert rep["shipped_up"]["found"] == "exact" and row["baseline"] == "shipped"
    assert row["chosen_us"] <= min(row["default_us"], row["shipped_us"], row["joint_us"])
    assert row["evaluations_joint"] <= 40 and row["evaluations_down"] <= 20
    # each batch size says where its wall time went; every timing is counted (search + re-measurement)
    b = row["wall_breakdown_s"]
    assert set(b) == {"compile", "eager", "capture", "replay", "other", "measured", "compiled_here"}
    assert b["measured"] >= row["evaluations_joint"] + row["evaluations_down"] + 3 * 3
    assert b["other"] <= row["wall_s"] + 0.05
    assert down[1]["USE_TMA"] is True  # the fake rewards TMA on the down GEMM
    # a rerun with one more batch size does only that one
    rep2 = tune_moe(shape, [1, 256, 1024], out, budget=40, down_budget=20, log=lambda m: None)
    assert [r["batch_size"] for r in rep2["rows"]] == [1, 256, 1024]
    assert rep2["rows"][0] == rep["rows"][0]
    assert json.loads((out / "reports" / f"{shape.tag}.json").read_text())["complete"]
    # a call for a few batch sizes keeps the others in the report, and completes only what all asked
    rep3 = tune_moe(shape, [1024, 2048], out, budget=40, down_budget=20, deadline_s=1e-9, log=lambda m: None)
    assert [r["batch_size"] for r in rep3["rows"]] == [1, 256, 1024]
    assert rep3["batch_sizes_requested"] == [1, 256, 1024, 2048] and not rep3["complete"]


def test_an_interrupt_keeps_and_writes_the_finished_batch_sizes(fake_gpu, tmp_path, monkeypatch):
    from tuner.kernels.sglang_tune import tune_moe

    calls = {"n": 0}
    real = _Timer.measure

    def measure(self, M, cfg, cutoff_us=None, replays=None):
        if M == 256:  # the call's SIGINT lands in the middle of the second batch size
            raise KeyboardInterrupt
        calls["n"] += 1
        return real(self, M, cfg, cutoff_us, replays)

    monkeypatch.setattr(_Timer, "measure", measure)
    shape = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    out = tmp_path / "out"
    logs = []
    rep = tune_moe(shape, [1, 256], out, budget=40, down_budget=20, log=logs.append)
    assert [r["batch_size"] for r in rep["rows"]] == [1] and not rep["complete"]
    assert any("interrupted" in m for m in logs)
    up = read_configs(out / "configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json")
    assert list(up) == [1]  # the file SGLang reads holds the finished batch size
    assert json.loads((out / "reports" / f"{shape.tag}.json").read_text())["rows"][0]["batch_size"] == 1


def test_a_batch_size_that_would_overrun_the_deadline_is_not_started(monkeypatch):
    from tuner.kernels import sglang_tune as st

    rows = {1: {"wall_s": 200.0}, 4: {"wall_s": 180.0}}
    assert st._expected_wall_s(rows) == 180.0 and st._expected_wall_s({}) == 0.0
    now = st.time.monotonic()
    assert st._past_deadline(now + 100, 180.0)  # 100 s left, the last batch size took 180
    assert not st._past_deadline(now + 300, 180.0)
    assert not st._past_deadline(None, 1e9)


def test_moe_grid_reports_fraction(fake_gpu, tmp_path):
    from tuner.kernels.sglang_tune import tune_moe

    shape = moe_shape("qwen3-30b-a3b", 1, 1, "fp8_w8a8", (128, 128))
    rep = tune_moe(shape, [64], tmp_path, budget=128, down_budget=0, grid=True, log=lambda m: None)
    row = rep["rows"][0]
    assert row["grid_complete"] and row["grid_visited"] == row["grid_size"] == 1280
    assert 0.98 <= row["joint_fraction_of_grid_best"] <= 1.0 + 1e-9
    assert rep["shipped_up"]["found"] == "fallback"  # SGLang's triton_3_2_0 file
    assert not (tmp_path / "configs/triton_3_6_0" / "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,"
                "block_shape=[128, 128]_down.json").exists()


def test_deadline_stops_between_batch_sizes(fake_gpu, tmp_path):
    from tuner.kernels.sglang_tune import tune_moe

    shape = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    rep = tune_moe(shape, [1, 2, 4], tmp_path, budget=10, down_budget=0, deadline_s=1e-9, log=lambda m: None)
    assert not rep["complete"] and rep["rows"] == [] and rep["files"] == []


def _tuner(args):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True)
    return types.SimpleNamespace(exit_code=r.returncode, output=r.stdout + r.stderr)


@pytest.mark.parametrize("args,fragment", [
    (["--batch-sizes", "0,8"], "positive"),
    (["--batch-sizes=-4"], "non-negative"),
    (["--batch-sizes", "a,b"], "integers"),
    (["--dtype", "bf16", "--kernel", "gemm"], "block-quantized fp8"),
    (["--dtype", "fp8_w8a8", "--block-shape", "128,96"], "block_shape"),
    (["--dtype", "bf16", "--block-shape", "128,128"], "block_shape"),
    (["--tp-size", "5"], "divisible"),
    (["--dtype", "fp8_w8a8", "--block-shape", "128,128", "--gemm-shape", "1,2"], "not linear layers"),
    (["--budget", "0"], "budget"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, args, fragment):
    out = tmp_path / "out"
    base = ["kernels", "tune", "--model", "qwen3-30b-a3b", "--tp-size", "1", "-o", str(out)]
    if "--tp-size" in args:
        base = base[:4] + base[6:]
    res = _tuner(base + args)
    assert res.exit_code == 2, res.output
    assert fragment in res.output
    assert not out.exists()


def test_unsupported_dtype_is_refused():
    res = _tuner(["kernels", "tune", "--model", "qwen3-30b-a3b", "--tp-size", "1", "--dtype", "int4",
                  "-o", "/tmp/never"])
    assert res.exit_code == 2 and "int4" in res.output


def test_unwritable_output_exits_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = _tuner(["kernels", "tune", "--model", "qwen3-30b-a3b", "--tp-size", "1", "-o", str(blocker / "sub")])
    assert res.exit_code == 2 and "not a directory" in res.output
    res = _tuner(["kernels", "tune", "--model", "qwen3-30b-a3b", "--tp-size", "1", "-o", "/proc/tuner-out"])
    assert res.exit_code == 2 and "not writable" in res.output
    assert blocker.read_text() == "x"


def test_table_command_prints_rows(fake_gpu, tmp_path):
    from tuner.kernels.sglang_tune import tune_moe

    shape = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    tune_moe(shape, [1], tmp_path, budget=10, down_budget=5, log=lambda m: None)
    res = CliRunner().invoke(cli, ["kernels", "table", str(tmp_path / "reports" / f"{shape.tag}.json")])
    assert res.exit_code == 0, res.output
    assert "shipped" in res.output and "\n     1 " in res.output


def _tune_into(out, shape, monkeypatch, **kw):
    from tuner.kernels import tune

    monkeypatch.setattr(tune, "_check_gpu", lambda: 1)
    monkeypatch.setattr(tune, "sglang_importable", lambda: True)
    return tune.run_sglang_tune(types.SimpleNamespace(moe=shape, gemms=[]), kw.pop("batch_sizes", [1, 64]), out,
                                budget=kw.pop("budget", 10), down_budget=kw.pop("down_budget", 5), **kw)


def test_shapes_share_one_directory_and_summary(fake_gpu, tmp_path, monkeypatch):
    from tuner.errors import ConfigError

    out = tmp_path / "h200"
    bf16 = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    fp8 = moe_shape("qwen3-30b-a3b", 1, 1, "fp8_w8a8", (128, 128))
    first = _tune_into(out, bf16, monkeypatch)
    doc = _tune_into(out, fp8, monkeypatch)
    assert [r["tag"] for r in doc["reports"]] == [fp8.tag]  # what this call did
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shapes"] == sorted([bf16.tag, fp8.tag]) and summary["complete"]
    assert {r["tag"]: r["rows"] for r in summary["reports"]}[bf16.tag] == first["reports"][0]["rows"]
    names = sorted(p.name for p in (out / "configs/triton_3_6_0").iterdir())
    assert len(names) == 4 and all(n.startswith("E=128,N=768,device_name=NVIDIA_H200") for n in names)
    # the table reads the directory: both shapes
    res = CliRunner().invoke(cli, ["kernels", "table", str(out)])
    assert res.exit_code == 0, res.output
    assert f"moe {bf16.tag}" in res.output and f"moe {fp8.tag}" in res.output
    # the same shape with other settings would overwrite its tile file: refused, file untouched
    before = (out / "configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json").read_text()
    with pytest.raises(ConfigError, match="other settings.*grid False there, True now"):
        _tune_into(out, bf16, monkeypatch, grid=True, down_budget=0)
    assert (out / "configs/triton_3_6_0/E=128,N=768,device_name=NVIDIA_H200.json").read_text() == before


def test_no_gemm_shape_starts_after_the_deadline(fake_gpu, tmp_path, monkeypatch):
    from tuner.kernels import tune
    from tuner.kernels.gemm_shapes import gemm_shapes

    started = []
    monkeypatch.setattr(tune, "_check_gpu", lambda: 1)
    monkeypatch.setattr(tune, "sglang_importable", lambda: True)
    import tuner.kernels.sglang_tune as st

    def fake_gemm(g, *a, **kw):
        started.append(g.tag)
        return {"tag": g.tag, "kind": "gemm", "complete": True, "rows": [], "files": []}

    monkeypatch.setattr(st, "tune_gemm", fake_gemm)
    shapes = gemm_shapes("qwen3-30b-a3b", 1)
    assert len(shapes) >= 2
    doc = tune.run_sglang_tune(types.SimpleNamespace(moe=None, gemms=shapes), [1], tmp_path, deadline_s=1e-9)
    # the first shape always starts (it stops at its first batch size); the rest wait for a rerun
    assert started == [shapes[0].tag]
    assert doc["not_started"] == [g.tag for g in shapes[1:]] and doc["complete"] is False
    doc = tune.run_sglang_tune(types.SimpleNamespace(moe=None, gemms=shapes), [1], tmp_path)
    assert doc["not_started"] == [] and doc["complete"] is True


def test_summary_is_rebuilt_from_every_report_even_after_a_cut_call(tmp_path):
    from tuner.kernels.tune import write_summary

    (tmp_path / "reports").mkdir()
    for tag, kind, done in (("N5120_K2048_fp8_b128x128", "gemm", False), ("E128_N768_K2048_bf16", "moe", True)):
        (tmp_path / "reports" / f"{tag}.json").write_text(json.dumps(
            {"kind": kind, "tag": tag, "complete": done, "rows": [{"batch_size": 1}]}))
    (tmp_path / "reports" / "E128_N768_K2048_bf16.timings.jsonl").write_text("{}\n")
    doc = json.loads(write_summary(tmp_path).read_text())
    assert doc["shapes"] == ["E128_N768_K2048_bf16", "N5120_K2048_fp8_b128x128"]  # MoE first
    assert doc["complete"] is False and not (tmp_path / "summary.json.tmp").exists()


def test_table_of_a_directory_without_reports_exits_2(tmp_path):
    res = _tuner(["kernels", "table", str(tmp_path)])
    assert res.exit_code == 2 and "reports/<shape>.json" in res.output, res.output


def test_table_of_the_committed_h200_directory():
    res = CliRunner().invoke(cli, ["kernels", "table", "results/kernels/h200/sglang"])
    assert res.exit_code == 0, res.output
    for tag in ("E128_N768_K2048_bf16", "E128_N768_K2048_fp8_w8a8_b128x128", "N5120_K2048_fp8_b128x128"):
        assert f" {tag} (NVIDIA H200, SGLang 0.5.17)" in res.output


def test_convergence_replays_each_search_in_its_evaluation_order(tmp_path):
    from tuner.kernels.convergence import convergence

    reports = tmp_path / "reports"
    reports.mkdir()
    up = lambda bm: {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                     "num_warps": 4, "num_stages": 3}
    rows = [{"batch_size": 16, "config": up(16), "us": t} for t in (120.0, None, 110.0, 104.0, 100.0, 101.0, 130.0, 99.5)]
    rows += [{"batch_size": 16, "config": {"up": up(16), "down": up(16)}, "us": t} for t in (98.0, 97.0)]
    rows += [{"batch_size": 16, "config": up(32), "us": t, "pass": "grid"} for t in (96.0, 150.0)]
    (reports / "E8_N64_K128_bf16.timings.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    doc = convergence(tmp_path)
    joint, down = doc["searches"]
    assert (joint["search"], joint["evaluations"], joint["best_us"]) == ("joint", 8, 99.5)
    # 104 is within 5% of 99.5, 100 within 1%, and only the 8th evaluation is the best itself
    assert joint["evals_to_within"] == {"2%": 5, "1%": 5, "0%": 8}
    assert joint["best_so_far_at_share"]["25%"] == round(120.0 / 99.5, 4)  # the first 2 (one failed)
    assert joint["best_so_far_at_share"]["75%"] == round(100.0 / 99.5, 4)
    assert joint["fraction_of_grid_best"] == round(96.0 / 99.5, 4) and joint["evals_to_within_grid"]["2%"] is None
    assert down["search"] == "down" and down["best_us"] == 97.0 and down["grid_best_us"] is None
    res = CliRunner().invoke(cli, ["kernels", "convergence", str(tmp_path)])
    assert res.exit_code == 0 and "E8_N64_K128_bf16" in res.output and "1.206" in res.output, res.output
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="timings.jsonl"):
        convergence(empty)
    (reports / "bad.timings.jsonl").write_text('{"us": 3}\n')
    with pytest.raises(ConfigError, match="line 1"):
        convergence(tmp_path)


def test_timing_rows_are_gzipped_and_a_plain_file_of_an_earlier_version_is_folded_in(tmp_path):
    from tuner.kernels.convergence import read_traces, timings_files, timings_path

    row = lambda us: json.dumps({"batch_size": 16, "config": {"BLOCK_SIZE_M": 16}, "us": us}) + "\n"
    (tmp_path / "E8_N64_K128_bf16.timings.jsonl").write_text(row(120.0) + row(100.0))
    path = timings_path(tmp_path, "E8_N64_K128_bf16")
    with gzip.open(path, "at") as f:  # what a later tuning call appends
        f.write(row(90.0))
    assert timings_files(tmp_path) == [path] and path.name == "E8_N64_K128_bf16.timings.jsonl.gz"
    (trace,) = read_traces(path)
    assert (trace.shape, trace.evaluations, trace.best_us) == ("E8_N64_K128_bf16", 3, 90.0)
    path.write_bytes(path.read_bytes()[:-9])  # a file cut short
    with pytest.raises(ConfigError, match="cannot read"):
        read_traces(path)


def test_table_marks_a_grid_cut_off_at_a_batch_size():
    from tuner.kernels.tune import summary_table

    row = {"batch_size": 16, "default_us": 20.3, "shipped_us": None, "found_us": 12.0, "grid_best_us": 11.9,
           "found_fraction_of_grid_best": 0.992, "chosen": "found", "speedup_vs_baseline": 1.69,
           "evaluations": 128, "wall_s": 30.0}
    rep = {"kind": "gemm", "tag": "N2048_K4096_fp8_b128x128", "complete": True,
           "rows": [{**row, "grid_complete": True}, {**row, "batch_size": 32, "grid_complete": False}]}
    lines = summary_table(rep)
    assert "11.9*" not in lines[2] and "0.992" in lines[2]
    assert "11.9*" in lines[3]
    assert any(line.startswith("* the grid was cut off") for line in lines)


class _NoisySearchTimer(_Timer):
    """One timing during the search is off by up to +-3% per config (fixed per config); the side-by-side
    re-timing (``replays=``) sees the true cost. So the search's own pick need not be its true best."""

    salt = "g"  # a draw under which the search's own pick is not the fastest of its leaders (asserted)

    def measure(self, M, cfg, cutoff_us=None, replays=None):
        self.measured += 1
        true = _cost(M, cfg)
        if replays is not None:
            return true
        import zlib

        return true * (1 + 0.03 * ((zlib.crc32((repr(cfg) + self.salt).encode()) % 2001) / 1000 - 1))


def test_the_search_leaders_are_re_timed_and_the_truly_fastest_is_kept(fake_gpu, tmp_path, monkeypatch):
    from tuner.kernels import sglang_tune

    monkeypatch.setattr(sys.modules["tuner.kernels.timing"], "GraphTimer", _NoisySearchTimer)
    shape = moe_shape("qwen3-30b-a3b", 1, 1, "fp8_w8a8", (128, 128))
    rep = sglang_tune.tune_moe(shape, [64], tmp_path, budget=128, down_budget=0, log=lambda m: None)
    row = rep["rows"][0]
    timings = [json.loads(line) for line in gzip.open(tmp_path / "reports" / f"{shape.tag}.timings.jsonl.gz", "rt")]
    by_noisy = sorted((t["us"], TileConfig.from_dict(t["config"])) for t in timings if t["us"] is not None)
    leaders = [c for _, c in by_noisy[:sglang_tune.RETIMED_SEARCH_LEADERS]]
    true = [_cost(64, c) for c in leaders]
    assert true[0] > min(true)  # the search's own pick is not its truly fastest leader here
    assert TileConfig.from_dict(row["joint_config"]) == leaders[0]
    assert row["search_best_us"] == pytest.approx(min(true), rel=1e-4)
    assert _cost(64, TileConfig.from_dict(row["up_config"])) <= min(true) + 1e-9  # the file keeps it


def test_time_share_spreads_what_is_left_over_the_batch_sizes_to_tune():
    from tuner.kernels.time_budget import DOWN_TIME_FRACTION, JOINT_TIME_FRACTION, time_share

    assert time_share(None, 0, 3, 0.0, down=True) is None and time_share(0, 0, 3, 0.0, down=True) is None
    ts = time_share(900, 300, 4, 1000.0, down=True)  # 600 s left over 4 batch sizes
    assert ts.share_s == pytest.approx(150)
    assert ts.joint_deadline == pytest.approx(1000 + JOINT_TIME_FRACTION * 150)
    assert ts.down_deadline == pytest.approx(1000 + (JOINT_TIME_FRACTION + DOWN_TIME_FRACTION) * 150)
    # without a down search the joint search has the down search's part too
    assert time_share(900, 300, 4, 1000.0, down=False).joint_deadline == pytest.approx(ts.down_deadline)
    # a spent budget leaves each search its warm-start round only (deadline now)
    assert time_share(900, 950, 2, 5.0, down=True).share_s == 0 and time_share(900, 950, 2, 5.0, down=True).joint_deadline == 5.0


def test_a_shape_time_budget_caps_the_searches_and_carries_over_calls(fake_gpu, tmp_path, monkeypatch):
    import time as time_mod

    from tuner.kernels.sglang_tune import tune_moe

    clock = {"t": 10_000.0}
    monkeypatch.setattr(time_mod, "monotonic", lambda: clock["t"])
    compiled = set()

    class _CompilingPool(_Pool):  # compiling a config the first time costs one (simulated) second
        def ensure(self, tasks, on_done=None):
            for _, cfg in tasks:
                if cfg not in compiled:
                    compiled.add(cfg)
                    clock["t"] += 1.0
            super().ensure(tasks, on_done)

    monkeypatch.setattr(sys.modules["tuner.kernels.sglang_compile"], "SGLangCompilePool", _CompilingPool)
    shape = moe_shape("qwen3-30b-a3b", 1, 1, "bf16")
    out = tmp_path / "out"
    t0 = clock["t"]
    lines: list[str] = []
    rep = tune_moe(shape, [1, 4, 16], out, budget=150, down_budget=60, shape_time_s=90, log=lines.append)
    spent = clock["t"] - t0
    rows = rep["rows"]
    assert rep["complete"] and [r["batch_size"] for r in rows] == [1, 4, 16]
    # far fewer than 150 + 60 evaluations fit 90 s of one-second compiles; every search still ran its warm start
    assert all(r["stopped_by_time"] and 8 <= r["evaluations_joint"] < 150 for r in rows)
    assert rows[0]["time_share_s"] == pytest.approx(30, abs=1)
    assert any(line.startswith("time budget 90 s for the shape") for line in lines)
    assert sum("(cut by time)" in line for line in lines) == 3  # each batch size's line says so
    assert spent <= 90 + 8  # a search stops at the end of the round that passes its deadline
    assert rep["shape_time_s"] == 90
    # the rows' wall times and the call's start-up are what a later call counts as spent (real clocks there)
    assert rows[0]["call_setup_s"] >= 0 and rows[1]["call_setup_s"] == rows[2]["call_setup_s"] == 0
    assert rep["shape_device_s"] == pytest.approx(sum(r["wall_s"] + r["call_setup_s"] for r in rows), abs=0.5)
    # without a time budget the evaluation budget alone decides
    rep2 = tune_moe(shape, [1], tmp_path / "free", budget=40, down_budget=0, log=lambda m: None)
    assert rep2["rows"][0]["evaluations_joint"] == 40 and not rep2["rows"][0]["stopped_by_time"]
    assert rep2["shape_time_s"] is None


def test_a_time_budget_replay_cuts_the_slow_batch_sizes_searches(tmp_path):
    from tuner.kernels.convergence import FIRST_ROUND, time_budget_replay
    from tuner.kernels.time_budget import DOWN_TIME_FRACTION, JOINT_TIME_FRACTION

    reports = tmp_path / "reports"
    reports.mkdir()
    up = lambda i: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": i,
                    "num_warps": 4, "num_stages": 3}
    joint = [200.0 - i for i in range(40)]  # every evaluation a little better: the last one is the best
    timing_rows = [{"batch_size": M, "config": up(i), "us": t} for M in (1, 64) for i, t in enumerate(joint)]
    timing_rows += [{"batch_size": 64, "config": {"up": up(0), "down": up(i)}, "us": 100.0 - i} for i in range(20)]
    (reports / "E8_N64_K128_bf16.timings.jsonl").write_text("\n".join(json.dumps(r) for r in timing_rows) + "\n")
    report = {"rows": [{"batch_size": 1, "wall_s": 20.0, "evaluations_joint": 40, "evaluations_down": 0},
                       {"batch_size": 64, "wall_s": 600.0, "evaluations_joint": 40, "evaluations_down": 20}]}
    (reports / "E8_N64_K128_bf16.json").write_text(json.dumps(report))
    doc = time_budget_replay(tmp_path, 220.0)
    small, large = doc["rows"]
    # M=1 took 20 s of its 110 s share: all of its search, and 90 s passed on to M=64
    assert small["evaluations_at_budget"] == {"joint": 40} and small["best_at_budget"] == {"joint": 1.0}
    assert large["share_s"] == pytest.approx(200.0)
    rate = 60 / 600.0  # M=64 made 60 evaluations in 600 s
    k_joint = max(FIRST_ROUND, int(JOINT_TIME_FRACTION * 200 * rate))
    k_down = max(FIRST_ROUND, int(DOWN_TIME_FRACTION * 200 * rate))
    assert large["evaluations_at_budget"] == {"joint": k_joint, "down": k_down} == {"joint": 12, "down": 8}
    assert large["best_at_budget"]["joint"] == round((200.0 - (k_joint - 1)) / 161.0, 4)
    assert large["best_at_budget"]["down"] == round((100.0 - (k_down - 1)) / 81.0, 4)
    assert doc["joint_worst_best_at_budget"] == large["best_at_budget"]["joint"]
    res = CliRunner().invoke(cli, ["kernels", "convergence", str(tmp_path), "--shape-time-s", "220"])
    assert res.exit_code == 0 and "12/40" in res.output and "took 620 s" in res.output, res.output
    bad = CliRunner().invoke(cli, ["kernels", "convergence", str(tmp_path), "--shape-time-s", "0"])
    assert bad.exit_code != 0
