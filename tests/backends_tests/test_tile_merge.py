"""A tuned trial's MoE tile files are merged over SGLang's shipped ones (keys the tuned file lacks keep
the shipped entries), so a file tuned at a few batch sizes does not run prefill with its M=16 tiles."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tuner.backends import moe_configs
from tuner.errors import ConfigError
from tuner.kernels.configfile import read_configs, write_configs
from tuner.kernels.targets import SGLANG_BATCH_SIZES

UP = "E=128,N=768,device_name=NVIDIA_H200.json"
DOWN = "E=128,N=768,device_name=NVIDIA_H200_down.json"
SHIPPED_KEYS = (1, 2, 4, 8, 16, 2048, 4096)
TUNED_KEYS = (1, 4, 16)


def _cfg(bm: int, bn: int, warps: int) -> dict:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "num_warps": warps, "num_stages": 3}


def _shipped_entries(keys=SHIPPED_KEYS, warps=8) -> dict[int, dict]:
    return {k: _cfg(64 if k >= 2048 else 16, 128, warps) for k in keys}


TUNED_UP = {k: _cfg(16, 32, 4) for k in TUNED_KEYS}  # differs from every shipped entry
TUNED_DOWN = {k: _cfg(16, 64, 4) for k in TUNED_KEYS}


def _shipped_root(tmp_path, files: dict[str, dict[int, dict]]) -> Path:
    """A fake SGLang config root: ``files`` maps ``triton_X_Y_Z/name`` to its entries."""
    root = tmp_path / "sglang_triton_utils"
    for rel, entries in files.items():
        write_configs(root / "configs" / rel, entries)
    write_configs(root / "configs/triton_3_6_0/E=64,N=1408,device_name=NVIDIA_H200.json", _shipped_entries())
    return root


def _tuned_dir(tmp_path, files: dict[str, dict[int, dict]]) -> Path:
    src = tmp_path / "tuned"
    for name, entries in files.items():
        write_configs(src / "configs/triton_3_6_0" / name, entries)
    return src


def _trial_file(tiles_or_root, name, vdir="triton_3_6_0") -> Path:
    root = getattr(tiles_or_root, "moe_dir", tiles_or_root)
    return root / "configs" / vdir / name


def test_missing_keys_keep_the_shipped_entries_and_the_down_file_gets_the_same_keys(tmp_path, caplog):
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {UP: TUNED_UP, DOWN: TUNED_DOWN})
    before = (shipped / "configs/triton_3_6_0" / UP).read_bytes()
    with caplog.at_level(logging.INFO, logger=moe_configs.__name__):
        tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                       shipped_root=shipped, required_gemm=[])
    up = read_configs(_trial_file(tiles, UP))
    assert sorted(up) == list(SHIPPED_KEYS)
    assert up == {**_shipped_entries(), **TUNED_UP}  # tuned at 1, 4, 16; shipped at 2, 8, 2048, 4096
    down = read_configs(_trial_file(tiles, DOWN))
    # no shipped _down: SGLang would have reused the shipped up file for the down GEMM
    assert down == {**_shipped_entries(), **TUNED_DOWN}
    assert tiles.filled_from_sglang == {f"configs/triton_3_6_0/{UP}": [2, 8, 2048, 4096],
                                         f"configs/triton_3_6_0/{DOWN}": [2, 8, 2048, 4096]}
    assert sorted(tiles.expected) == [UP, DOWN]
    # the other shipped files are there too, and the installed copy was not written to
    assert _trial_file(tiles, "E=64,N=1408,device_name=NVIDIA_H200.json").is_file()
    assert (shipped / "configs/triton_3_6_0" / UP).read_bytes() == before
    lines = {r.getMessage().split(":")[0]: r.getMessage() for r in caplog.records}  # one line per merged file
    assert "3 tuned key(s), 4 kept" in lines[f"configs/triton_3_6_0/{UP}"]
    assert lines[f"configs/triton_3_6_0/{UP}"].endswith("(exact)")
    assert lines[f"configs/triton_3_6_0/{DOWN}"].endswith(f"{UP} (up_reused)")
    # the two-value signature still works
    root, written = moe_configs.prepare_trial_moe_dir(tmp_path / "t2", src, triton_version="3.6.0",
                                                      shipped_root=shipped)
    assert written == [f"configs/triton_3_6_0/{UP}", f"configs/triton_3_6_0/{DOWN}"]
    assert read_configs(_trial_file(root, UP)) == up


def test_a_shipped_file_of_an_older_triton_fills_the_tuned_one(tmp_path, caplog):
    shipped = _shipped_root(tmp_path, {f"triton_3_2_0/{UP}": _shipped_entries(),
                                       f"triton_3_1_0/{UP}": _shipped_entries(warps=2)})  # older: not read
    src = _tuned_dir(tmp_path, {UP: TUNED_UP})
    with caplog.at_level(logging.INFO, logger=moe_configs.__name__):
        root, _ = moe_configs.prepare_trial_moe_dir(tmp_path / "t", src, triton_version="3.6.0",
                                                    shipped_root=shipped)
    # the fallback (another Triton version's file) fills where no tuned key covers: beyond the tuned
    # range (2048 and 4096), and 2 and 8, 2x above the M=1 and M=4 keys that would serve them
    uncovered = {k: v for k, v in _shipped_entries().items() if k not in TUNED_KEYS}
    assert sorted(uncovered) == [2, 8, 2048, 4096]
    assert read_configs(_trial_file(root, UP)) == {**uncovered, **TUNED_UP}
    assert read_configs(_trial_file(root, UP, "triton_3_2_0")) == _shipped_entries()  # copied as shipped
    assert any("fallback" in r.getMessage() and "triton_3_2_0" in r.getMessage() for r in caplog.records)
    assert not _trial_file(root, DOWN).exists()  # SGLang reuses the merged up file for the down GEMM


FP8_NAME = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
FP8_DOWN = FP8_NAME.removesuffix(".json") + "_down.json"
#: SGLang 0.5.17's get_default_config for block-fp8 [128, 128] (the same at every M)
FP8_BLOCK_DEFAULT = {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32,
                     "num_warps": 4, "num_stages": 3}


def test_no_shipped_file_of_that_name_copies_a_tuned_file_that_covers_every_batch_size(tmp_path):
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    complete = {k: _cfg(32, 64, 4) for k in SGLANG_BATCH_SIZES}
    src = _tuned_dir(tmp_path, {FP8_NAME: complete})
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                   shipped_root=shipped, required_gemm=[])
    out = _trial_file(tiles, FP8_NAME)
    assert out.read_bytes() == (src / "configs/triton_3_6_0" / FP8_NAME).read_bytes()
    assert tiles.filled_from_sglang == {}


def test_gaps_between_keys_more_than_1_5x_above_the_serving_key_get_sglangs_default(tmp_path):
    # a tune at 9 batch sizes: SGLang would serve M=1024 with the M=512 tiles (nearer than 2048),
    # measured 1.13x slower than its default on the H200 (results/kernels/h200/sglang)
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    nine = {k: _cfg(32, 64, 4) for k in (1, 4, 16, 32, 64, 128, 512, 2048, 4096)}
    src = _tuned_dir(tmp_path, {FP8_NAME: nine})
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                   shipped_root=shipped, required_gemm=[])
    # 2 (2x above 1), 8 (2x above 4), 256 (2x above 128), 1024 (2x above 512); 24, 48, 96 and 3072
    # are 1.5x above theirs, 1536 is below 2048's
    assert tiles.filled_from_sglang == {f"configs/triton_3_6_0/{FP8_NAME}": [2, 8, 256, 1024]}
    from tuner.kernels.configfile import nearest_config
    up = read_configs(_trial_file(tiles, FP8_NAME))
    assert nearest_config(up, 1280) == FP8_BLOCK_DEFAULT and nearest_config(up, 768) == nine[512]


def test_no_shipped_file_fills_the_uncovered_batch_sizes_with_sglangs_default(tmp_path, caplog):
    # a tune cut short at M=16 (a time cap): without the fill SGLang would serve every prefill chunk
    # with the M=16 tiles
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {FP8_NAME: TUNED_UP, FP8_DOWN: TUNED_DOWN})
    with caplog.at_level(logging.INFO, logger=moe_configs.__name__):
        tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                       shipped_root=shipped, required_gemm=[])
    # every key above 16, and 2 and 8 (2x above the M=1 and M=4 keys that would serve them)
    filled = [2, 8, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096]
    up = read_configs(_trial_file(tiles, FP8_NAME))
    assert up == {**TUNED_UP, **{k: FP8_BLOCK_DEFAULT for k in filled}}
    down = read_configs(_trial_file(tiles, FP8_DOWN))
    assert down == {**TUNED_DOWN, **{k: FP8_BLOCK_DEFAULT for k in filled}}
    assert tiles.filled_from_sglang == {f"configs/triton_3_6_0/{FP8_NAME}": filled,
                                        f"configs/triton_3_6_0/{FP8_DOWN}": filled}
    # the batch sizes SGLang serves: tuned tiles near the tuned keys, its default beyond them
    from tuner.kernels.configfile import nearest_config
    assert nearest_config(up, 18) == TUNED_UP[16] and nearest_config(up, 2000) == FP8_BLOCK_DEFAULT
    assert any("filled with SGLang's default config" in r.getMessage() for r in caplog.records)


def test_interior_gaps_the_serving_key_does_not_cover_are_filled_too(tmp_path):
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {FP8_NAME: {k: _cfg(32, 64, 4) for k in (1, 64, 4096)}})
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                   shipped_root=shipped, required_gemm=[])
    # 2..32 are served by the M=1 key (nearer than 64) and more than 1.5x above it; 48 is 64's, 1.33x
    # below, and 96 1.5x above; 128..2048 are 64's, more than 1.5x above; 3072 is 4096's, 1.33x below
    assert tiles.filled_from_sglang == {f"configs/triton_3_6_0/{FP8_NAME}": [2, 4, 8, 16, 24, 32, 128, 256, 512,
                                                                             1024, 1536, 2048]}


def test_bf16_default_fill_follows_sglangs_m_against_e_rule():
    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    got = moe_configs.sglang_default_entries(name, [128, 256])
    assert got[128] == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
                        "num_warps": 4, "num_stages": 3}  # M <= E (Triton's launch defaults spelled out)
    assert got[256] == {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
                        "num_warps": 4, "num_stages": 3}
    # a dtype whose default rules we do not replicate is not filled (the file is copied as it is)
    assert moe_configs.sglang_default_entries("E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a16.json",
                                              [256]) is None


def test_no_shipped_file_of_an_unreplicated_dtype_copies_the_tuned_file(tmp_path):
    name = "E=128,N=768,device_name=NVIDIA_H200,dtype=int8_w8a16.json"
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {name: TUNED_UP})
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                   shipped_root=shipped, required_gemm=[])
    assert read_configs(_trial_file(tiles, name)) == TUNED_UP
    assert tiles.filled_from_sglang == {}


def test_without_shipped_files_nothing_is_merged(tmp_path):
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {UP: TUNED_UP, DOWN: TUNED_DOWN})
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                   include_shipped=False, shipped_root=shipped, required_gemm=[])
    for name in (UP, DOWN):
        assert _trial_file(tiles, name).read_bytes() == (src / "configs/triton_3_6_0" / name).read_bytes()
    assert tiles.filled_from_sglang == {}
    assert not _trial_file(tiles, "E=64,N=1408,device_name=NVIDIA_H200.json").exists()


def test_a_corrupt_tuned_file_is_refused_before_anything_is_written(tmp_path):
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {UP: TUNED_UP})
    (src / "configs/triton_3_6_0" / DOWN).write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        moe_configs.prepare_trial_moe_dir(tmp_path / "t", src, triton_version="3.6.0", shipped_root=shipped)
    assert not _trial_file(tmp_path / "t" / "moe", UP).exists()


def test_a_filled_down_entry_takes_the_block_size_m_of_the_up_entry(tmp_path):
    # a shipped _down whose BLOCK_SIZE_M disagrees with the shipped up's: both GEMMs of a batch share
    # one BLOCK_SIZE_M, so a filled down entry takes the up's; and the up's key set (no 8192)
    shipped_down = {k: _cfg(32, 256, 8) for k in SHIPPED_KEYS + (8192,)}
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries(),
                                       f"triton_3_6_0/{DOWN}": shipped_down})
    src = _tuned_dir(tmp_path, {DOWN: TUNED_DOWN})  # only the down file tuned: the up stays shipped
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "t", src, triton_version="3.6.0",
                                                   shipped_root=shipped, required_gemm=[])
    down = read_configs(_trial_file(tiles, DOWN))
    assert sorted(down) == list(SHIPPED_KEYS)
    assert {k: down[k] for k in TUNED_KEYS} == TUNED_DOWN
    up = _shipped_entries()
    assert all(down[k] == {**shipped_down[k], "BLOCK_SIZE_M": up[k]["BLOCK_SIZE_M"]} for k in (2, 8, 2048, 4096))
    assert read_configs(_trial_file(tiles, UP)) == up  # the shipped copy, untouched
    assert tiles.filled_from_sglang == {f"configs/triton_3_6_0/{DOWN}": [2, 8, 2048, 4096]}


def test_the_plan_records_the_keys_kept_from_shipped(tmp_path, monkeypatch):
    from tests.backends_tests.test_sglang import request
    from tuner.backends.sglang import SGLangBackend

    name = "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{name}": _shipped_entries()})
    monkeypatch.setattr(moe_configs, "installed_sglang_config_root", lambda: shipped / "configs")
    src = _tuned_dir(tmp_path, {name: TUNED_UP})
    plan = SGLangBackend().build_plan(
        request(tmp_path, {"tp-size": 8, "quantization": "fp8"}, {"moe-tile-configs": "tuned"},
                moe_config_dir=str(src), triton_version="3.6.0"), tmp_path / "trial")
    assert plan.facts["tile_keys_from_sglang"] == {f"configs/triton_3_6_0/{name}": [2, 8, 2048, 4096]}
    assert read_configs(Path(plan.files["moe_config_dir"]) / "configs/triton_3_6_0" / name) == \
        {**_shipped_entries(), **TUNED_UP}


def test_merge_only_fills_the_tuned_file_without_copying_sglangs_other_files(tmp_path):
    # what `tuner study export` builds: the model's own files, merged, and nothing else of SGLang's
    shipped = _shipped_root(tmp_path, {f"triton_3_6_0/{UP}": _shipped_entries()})
    src = _tuned_dir(tmp_path, {UP: TUNED_UP, DOWN: TUNED_DOWN})
    root, written, filled = moe_configs.build_trial_moe_dir(
        tmp_path / "export", src, triton_version="3.6.0", include_shipped=False, merge_shipped=True,
        required=(), shipped_root=shipped)
    names = sorted(p.name for p in (root / "configs/triton_3_6_0").iterdir())
    assert names == sorted([UP, DOWN])  # the other shipped shape is not copied
    assert sorted(read_configs(_trial_file(root, UP))) == list(SHIPPED_KEYS)
    assert filled[f"configs/triton_3_6_0/{UP}"] == [2, 8, 2048, 4096]
    # without the merge the file is the tuned one, keys 1, 4, 16 only
    root2, _, filled2 = moe_configs.build_trial_moe_dir(
        tmp_path / "plain", src, triton_version="3.6.0", include_shipped=False, merge_shipped=False,
        required=(), shipped_root=shipped)
    assert sorted(read_configs(_trial_file(root2, UP))) == list(TUNED_KEYS) and filled2 == {}
