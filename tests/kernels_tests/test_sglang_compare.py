"""What `tuner kernels compare` times and prints (CPU: the file look-up and the table; the timing is GPU)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli
from tuner.kernels.configfile import write_configs
from tuner.kernels.sglang_compare import _both, compare_table, files_in
from tuner.kernels.sglang_tune import pair_at
from tuner.kernels.sglang_env import Found
from tuner.kernels.shapes import moe_shape

DEV = "NVIDIA H200"
UP = {1: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 5},
      512: {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 5},
      2048: {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 16, "num_warps": 4, "num_stages": 4}}


def _dsv3():
    return moe_shape("deepseek-v3", 1, 1, "fp8_w8a8", (128, 128))


def _write(tmp_path, shape, down: bool):
    from tuner.kernels.configfile import moe_config_filename

    vdir = tmp_path / "configs" / "triton_3_6_0"
    write_configs(vdir / moe_config_filename(shape.num_experts, shape.intermediate, DEV, shape.config_dtype,
                                             shape.block_shape), UP)
    if down:
        write_configs(vdir / moe_config_filename(shape.num_experts, shape.intermediate, DEV, shape.config_dtype,
                                                 shape.block_shape, down=True),
                      {m: {**c, "BLOCK_SIZE_N": 64, "USE_TMA": m == 2048} for m, c in UP.items()})


def test_the_entries_timed_are_those_sglang_reads_at_each_batch_size(tmp_path):
    shape = _dsv3()
    _write(tmp_path, shape, down=True)
    up, down = files_in(tmp_path, shape, DEV, "triton_3_6_0")
    assert up.found is Found.EXACT and down.found is Found.EXACT
    # the nearest key, as SGLang's lookup: 256 is 255 from 1 and 256 from 512; 300 is nearer 512
    assert _both(pair_at(up, down, 256))[0].BLOCK_SIZE_M == 16
    u, d = _both(pair_at(up, down, 300))
    assert u.BLOCK_SIZE_M == 32 and d.BLOCK_SIZE_N == 64 and d.BLOCK_SIZE_M == 32
    u, d = _both(pair_at(up, down, 1500))
    assert u.BLOCK_SIZE_M == 64 and d.USE_TMA is True
    u, d = _both(pair_at(up, down, 100))
    assert u.BLOCK_SIZE_M == 16


def test_without_a_down_file_the_up_tile_serves_both_gemms(tmp_path):
    shape = _dsv3()
    _write(tmp_path, shape, down=False)
    up, down = files_in(tmp_path, shape, DEV, "triton_3_6_0")
    assert down.found is Found.UP_REUSED
    assert pair_at(up, down, 2048)[1] is None  # SGLang reuses the up tile
    u, d = _both(pair_at(up, down, 2048))
    assert d.tile == u and d.USE_TMA is False


def test_another_triton_folder_is_read_as_sglang_falls_back(tmp_path):
    shape = _dsv3()
    _write(tmp_path, shape, down=True)
    up, _ = files_in(tmp_path, shape, DEV, "triton_3_7_0")
    assert up.found is Found.FALLBACK
    assert files_in(tmp_path, moe_shape("qwen3-30b-a3b", 1), DEV, "triton_3_6_0")[0].found is Found.NONE


def test_the_table_names_each_batch_sizes_ratio_and_block_sizes():
    doc = {"tag": "E257", "device_name": DEV, "sglang_version": "0.5.17", "routing": "collapsed", "routed_pool": 10,
           "rounds": 5, "rows": [{"batch_size": 256, "default_us": 200.0, "files_us": 300.0, "files_vs_default": 1.5,
                                  "files_vs_default_range": [1.4, 1.6],
                                  "configs": {"default": {"BLOCK_SIZE_M": 64}, "files": {"up": {"BLOCK_SIZE_M": 16}}}}]}
    lines = compare_table(doc)
    assert "over 10 routed experts" in lines[0]
    row = lines[-1].split()
    assert row[0] == "256" and row[1] == "200.0" and row[2] == "-" and row[4] == "1.500" and row[-1] == "16"


def test_bad_input_exits_2_with_the_key(tmp_path):
    base = ["kernels", "compare", "--model", "deepseek-v3", "--tp-size", "1", "--dtype", "fp8_w8a8",
            "--block-shape", "128,128", "--configs", str(tmp_path)]
    r = run_cli(base + ["--routing", "collapsed", "--routed-pool", "4"])
    assert r.returncode == 2 and "routed-pool" in r.stderr and "between top-k 8" in r.stderr
    r = run_cli(base + ["--routing", "serving", "--routed-pool", "10"])
    assert r.returncode == 2 and "only to --routing collapsed" in r.stderr
    r = run_cli(base + ["--batch-sizes", "0,16"])
    assert r.returncode == 2 and "batch" in r.stderr
    r = run_cli(base + ["--rounds", "0"])
    assert r.returncode == 2 and "rounds" in r.stderr
    assert not list(tmp_path.iterdir())


def test_as_served_times_the_copy_a_trial_gets(tmp_path, monkeypatch):
    """--as-served times the trial's copy: a file cut short at M=512 (no shipped file) gets SGLang's
    default beyond it. The GPU timing is replaced by a look-up of what it would time."""
    import json

    from click.testing import CliRunner

    import tuner.backends.moe_configs as moe_configs
    import tuner.kernels.sglang_compare as sglang_compare
    import tuner.kernels.tune as tune
    from tuner.cli.kernels import kernels

    shape = _dsv3()
    tuned = tmp_path / "tuned"
    _write(tuned, shape, down=True)
    for path in (tuned / "configs/triton_3_6_0").iterdir():  # cut short: keys 1 and 512 only
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "2048"}))
    shipped = tmp_path / "sglang_utils" / "configs"
    (shipped / "triton_3_6_0").mkdir(parents=True)  # an SGLang that ships nothing for this shape
    monkeypatch.setattr(moe_configs, "installed_sglang_config_root", lambda: shipped)
    monkeypatch.setattr(tune, "_check_gpu", lambda: 1)
    monkeypatch.setattr(tune, "sglang_importable", lambda: True)
    timed: list[dict] = []

    def fake_compare(shape, sizes, config_dir, **_):
        up, down = files_in(config_dir, shape, DEV, "triton_3_6_0")
        timed.append({M: up.nearest(M)["BLOCK_SIZE_M"] for M in sizes})
        return {"config_dir": str(config_dir), "files": {"up": str(up.path)}, "rows": []}

    monkeypatch.setattr(sglang_compare, "compare_moe", fake_compare)
    args = ["compare", "--model", "deepseek-v3", "--tp-size", "1", "--dtype", "fp8_w8a8", "--block-shape",
            "128,128", "--configs", str(tuned), "--batch-sizes", "512,2048,4096", "--json"]
    raw = CliRunner().invoke(kernels, args)
    served = CliRunner().invoke(kernels, args + ["--as-served"])
    assert raw.exit_code == 0 and served.exit_code == 0, (raw.output, served.output)
    # as they are, 2048 and 4096 run the M=512 tiles; as served, SGLang's default (BLOCK_SIZE_M 64)
    assert timed == [{512: 32, 2048: 32, 4096: 32}, {512: 32, 2048: 64, 4096: 64}]
    doc = json.loads(served.output)
    assert doc["as_served"] is True and doc["config_dir"] == str(tuned)
    assert doc["files"]["up"].startswith(str(tuned)) and Path(doc["files"]["up"]).is_file()
    filled = next(iter(doc["keys_from_sglang"].values()))
    assert 2048 in filled and 4096 in filled and 512 not in filled
