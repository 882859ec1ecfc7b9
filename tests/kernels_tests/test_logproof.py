"""The server-log proof on log excerpts built from SGLang 0.5.17's own format strings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tuner.cli import cli
from tuner.errors import ConfigError
from tuner.kernels.logproof import prove_loaded, scan_log

REF = Path(os.environ.get("TUNER_SGLANG_REF", "/work/ref")) / "sglang-0.5.17" / "sglang"

# SGLang 0.5.17's messages: f-strings and %-format pieces exactly as written in its source
MOE_FOUND = "Using MoE kernel config from {config_file_path}."
MOE_FALLBACK = ("Config file not found at {config_file_path}. Fallback to triton version {try_triton_version} and use "
                "MoE kernel config from {try_config_file_path}. Performance might be sub-optimal!")
MOE_DEFAULT = ("Using default MoE kernel config. Performance might be sub-optimal! "
               "Config file not found at %s, you can create them with "
               "https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton")
MOE_DOWN_REUSE = ("Down MoE config file not found at %s; reusing the tuned "
                  "up-projection config without TMA. Performance might be sub-optimal.")
GEMM_FOUND = "Using configuration from {config_file_path} for W8A8 Block FP8 kernel."
GEMM_DEFAULT = ("Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
                "Config file not found at %s")

UP = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
DOWN = UP.replace(".json", "_down.json")
GEMM = "N=5120,K=2048,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"


def _line(msg: str, rank: str = "TP0") -> str:
    return f"[2026-12-01 10:00:0{len(msg) % 10} {rank}] {msg}"


@pytest.mark.skipif(not REF.is_dir(), reason="SGLang 0.5.17 source not unpacked")
def test_format_strings_are_sglang_0517s():
    moe = (REF / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py").read_text()
    gemm = (REF / "kernels/ops/quantization/fp8_kernel.py").read_text()
    assert f'f"{MOE_FOUND}"' in moe and f'f"{MOE_FALLBACK}",' in moe
    for piece in ('"Using default MoE kernel config. Performance might be sub-optimal! "',
                  '"Config file not found at %s, you can create them with https://github.com/sgl-project/sglang/tree/'
                  'main/benchmark/kernels/fused_moe_triton"',
                  '"Down MoE config file not found at %s; reusing the tuned "',
                  '"up-projection config without TMA. Performance might be sub-optimal."'):
        assert piece in moe
    assert f'f"{GEMM_FOUND}"' in gemm
    assert '"Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "' in gemm
    assert '"Config file not found at %s"' in gemm


def _tuned_log(ours: Path, gemm_site: Path) -> str:
    v = ours / "configs" / "triton_3_6_0"
    gemm_dir = gemm_site / "sglang/kernels/ops/quantization/configs"
    return "\n".join([
        _line("Load weight begin."),
        _line(MOE_FOUND.format(config_file_path=v / UP)),
        _line(MOE_FOUND.format(config_file_path=v / DOWN)),
        _line(GEMM_FOUND.format(config_file_path=gemm_dir / GEMM)),
        _line(GEMM_DEFAULT % "/site/sglang/kernels/ops/quantization/configs/N=2048,K=4096,device_name=NVIDIA_H200,"
                             "dtype=fp8_w8a8,block_shape=[128, 128].json"),
        _line("The server is fired up and ready to roll!"),
    ]) + "\n"


def test_proof_when_our_files_are_loaded(tmp_path):
    ours, site = tmp_path / "moe", tmp_path / "sglang-site"
    proof = prove_loaded(_tuned_log(ours, site), [UP, DOWN, GEMM], [ours, site])
    assert proof.loaded, proof.summary()
    assert set(proof.loaded_ours) == {UP, DOWN, GEMM}
    # the untuned o_proj GEMM's default warning is reported, but is not about our files
    assert [w.kind for w in proof.other_warnings] == ["gemm_default"]


def test_a_gzipped_log_file_is_read_as_its_text(tmp_path):
    # committed server logs are gzipped; reading the bytes as text would find no file loaded
    import gzip

    ours, site = tmp_path / "moe", tmp_path / "sglang-site"
    log = tmp_path / "sglang0.log.gz"
    with gzip.open(log, "wt") as f:
        f.write(_tuned_log(ours, site))
    assert prove_loaded(log, [UP, DOWN, GEMM], [ours, site]).loaded
    bad = tmp_path / "broken.log.gz"
    bad.write_bytes(gzip.compress(_tuned_log(ours, site).encode())[:40])
    with pytest.raises(ConfigError):
        prove_loaded(bad, [UP], [ours])


def test_no_proof_when_sglang_fell_back_or_used_defaults(tmp_path):
    ours = tmp_path / "moe"
    wanted = ours / "configs" / "triton_3_6_0" / UP
    shipped = "/site/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_2_0/" + UP
    log = "\n".join([
        _line(MOE_FALLBACK.format(config_file_path=wanted, try_triton_version="3.2.0", try_config_file_path=shipped)),
        _line(MOE_DOWN_REUSE % (ours / "configs" / "triton_3_6_0" / DOWN)),
    ])
    proof = prove_loaded(log, [UP, DOWN], [ours])
    assert not proof.loaded
    assert proof.missing == [UP, DOWN]
    assert [w.kind for w in proof.warnings] == ["moe_fallback", "moe_down_reuse"]
    assert "moe_fallback" in proof.summary()


def test_no_proof_when_the_file_came_from_elsewhere(tmp_path):
    # SGLang's own directory, a file of the same name: not ours
    elsewhere = Path("/site/sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_3_6_0") / UP
    log = _line(MOE_FOUND.format(config_file_path=elsewhere))
    proof = prove_loaded(log, [UP], [tmp_path / "moe"])
    assert not proof.loaded and proof.missing == [UP]


def test_default_warning_for_an_expected_file_fails_the_proof(tmp_path):
    ours = tmp_path / "moe"
    path = ours / "configs" / "triton_3_6_0" / UP
    log = "\n".join([_line(MOE_FOUND.format(config_file_path=path)),
                     _line(MOE_DEFAULT % (ours / "configs/triton_3_6_0" / DOWN))])
    proof = prove_loaded(log, [UP, DOWN], [ours])
    assert not proof.loaded and proof.warnings[0].kind == "moe_default"


def test_scan_reads_paths_with_spaces_and_line_numbers(tmp_path):
    ev = scan_log("noise\n" + _line(MOE_FOUND.format(config_file_path=tmp_path / UP)))
    assert len(ev) == 1 and ev[0].line_number == 2 and ev[0].path == str(tmp_path / UP)


def test_proof_needs_expected_names():
    with pytest.raises(ConfigError):
        prove_loaded("x\n", [], ["/tmp"])


def test_prove_log_command_exit_codes(tmp_path):
    ours, site = tmp_path / "moe", tmp_path / "sglang-site"
    log = tmp_path / "sglang0.log"
    log.write_text(_tuned_log(ours, site))
    runner = CliRunner()
    ok = runner.invoke(cli, ["kernels", "prove-log", str(log), "--tuned-dir", str(ours), "--tuned-dir", str(site),
                             "--expect", UP, "--expect", GEMM])
    assert ok.exit_code == 0, ok.output
    assert "loaded all 2" in ok.output
    bad = runner.invoke(cli, ["kernels", "prove-log", str(log), "--tuned-dir", str(ours), "--expect",
                              "E=1,N=1,device_name=NVIDIA_H200.json"])
    assert bad.exit_code == 1
