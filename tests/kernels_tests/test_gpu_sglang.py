"""GPU checks of SGLang's own kernels as the tuner calls them, and a tuned file loaded by a server."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytest.importorskip("sglang")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tuner.kernels.gemm_shapes import GemmShape  # noqa: E402
from tuner.kernels.shapes import MoEShape, moe_shape  # noqa: E402
from tuner.kernels.space import DownTileConfig, TileConfig  # noqa: E402

SMALL_BF16 = MoEShape(num_experts=16, intermediate=256, hidden=512, topk=4, dtype="bf16")
SMALL_FP8 = MoEShape(num_experts=16, intermediate=256, hidden=512, topk=4, dtype="fp8_w8a8", block_shape=(128, 128))
SMALL_FUSED = MoEShape(num_experts=17, intermediate=256, hidden=512, topk=5, dtype="bf16", fused_shared_experts=1)


@pytest.mark.parametrize("shape", [SMALL_BF16, SMALL_FP8, SMALL_FUSED], ids=["bf16", "fp8-block", "fused-shared"])
@pytest.mark.parametrize("M", [1, 7, 100])
def test_sglang_moe_matches_torch(shape, M):
    from tuner.kernels.sglang_kernels import Routing, SGLangMoE, reference_moe

    p = SGLangMoE(shape, routing=Routing.SERVING, rotations=2)
    ref = reference_moe(p, M, 1)
    up = TileConfig(16, 64, 128 if shape.block_shape else 64, 1, 4, 3)
    for cfg in (up, (up, DownTileConfig.from_tile(up)), (up, DownTileConfig(16, 128, 64, 1, 4, 2, USE_TMA=False))):
        with p.using(cfg):
            out = p.launch(M, None, 1).float()
        tol = 0.08 if shape.dtype == "fp8_w8a8" else 0.02
        err = (out - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
        assert err < tol, (cfg, err)
    ids = p.batch(M)["rotations"][1][1]
    if shape.fused_shared_experts:
        assert bool((ids[:, -1] >= shape.routed_experts).all())


def test_two_routing_draws_time_a_large_call_as_eight_do():
    # past twice the L2 per call the timer cycles 2 routing draws, not 8 (shorter replays): the
    # figure must not move with it
    from tuner.kernels.sglang_kernels import SGLangMoE
    from tuner.kernels.timing import GraphTimer

    shape = moe_shape("qwen3-30b-a3b", 1, 1, "fp8_w8a8", (128, 128))
    few, full = SGLangMoE(shape), SGLangMoE(shape)
    full.l2_bytes = 1 << 50  # as if the L2 held everything: all 8 draws
    assert (few.rotations_for(64), full.rotations_for(64)) == (2, 8)
    cfg = TileConfig(16, 128, 128, 1, 4, 3)
    # interleaved rounds, each its own ratio: the GPU's clock drifts between timings taken one
    # after the other (3.9% apart on the H200 when the 3 of each ran in sequence, call 13)
    timers = GraphTimer(few), GraphTimer(full)
    rounds = [[t.measure(64, cfg, replays=20) for t in timers] for _ in range(5)]
    ratio = statistics.median(a / b for a, b in rounds)
    assert abs(ratio - 1) < 0.03, rounds


def test_sglang_gemm_matches_torch():
    from tuner.kernels.sglang_kernels import SGLangBlockGemm, reference_gemm

    p = SGLangBlockGemm(GemmShape(640, 1024), rotations=2)
    for M in (1, 33, 256):
        ref = reference_gemm(p, M, 1)
        for cfg in (TileConfig(16, 64, 128, 1, 4, 3), TileConfig(64, 128, 64, 32, 8, 4)):
            with p.using(cfg):
                out = p.launch(M, None, 1).float()
            assert (out - ref).abs().max().item() / ref.abs().max().item() < 0.02


def test_config_injection_reaches_sglangs_lookup():
    """The tile config we time is the one SGLang's fused_experts resolves."""
    from tuner.kernels.sglang_kernels import SGLangMoE, runtime

    p = SGLangMoE(SMALL_BF16, rotations=1)
    seen = []
    rt = runtime()
    real = rt.moe.moe_align_block_size

    def spy(topk_ids, block_size, num_experts, *a, **kw):
        seen.append(block_size)
        return real(topk_ids, block_size, num_experts, *a, **kw)

    rt.moe.moe_align_block_size = spy
    try:
        with p.using(TileConfig(32, 64, 64, 1, 4, 3)):
            p.launch(8, None, 0)
        with p.using((TileConfig(64, 64, 64, 1, 4, 3), DownTileConfig(64, 32, 64, 1, 4, 3))):
            p.launch(8, None, 0)
    finally:
        rt.moe.moe_align_block_size = real
    assert seen == [32, 64]


def test_timer_and_short_tune_write_files(tmp_path):
    from tuner.kernels.sglang_tune import tune_gemm, tune_moe

    rep = tune_moe(SMALL_BF16, [1, 64], tmp_path, budget=12, down_budget=6)
    assert rep["complete"] and all(r["chosen_us"] > 0 for r in rep["rows"])
    assert any(f.endswith("_down.json") for f in rep["files"])
    rep = tune_gemm(GemmShape(640, 1024), [1, 64], tmp_path, budget=12)
    assert rep["complete"] and rep["files"][0].startswith("gemm_configs/N=640,K=1024,")


def _wait(url, proc, timeout_s=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(2)
    return False


@pytest.mark.skipif(not os.environ.get("TUNER_GPU_SERVER_TEST"), reason="set TUNER_GPU_SERVER_TEST=1 (starts a server)")
def test_sglang_server_loads_our_tuned_files(tmp_path):
    """A tiny Qwen3-MoE served by SGLang with our tile directory: its log names our files."""
    from tuner.backends import moe_configs
    from tuner.kernels.configfile import moe_config_filename, write_configs
    from tuner.kernels.logproof import prove_loaded

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 512,
        "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
        "decoder_sparse_step": 1, "norm_topk_prob": True, "rope_theta": 1000000.0, "tie_word_embeddings": False}))
    import triton

    vdir = "triton_" + triton.__version__.split("+")[0].replace(".", "_")
    dev = torch.cuda.get_device_name(0)
    tuned = tmp_path / "tuned"
    cfg = {m: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 3} for m in (1, 64, 1024)}
    write_configs(tuned / "configs" / vdir / moe_config_filename(16, 256, dev), cfg)
    write_configs(tuned / "configs" / vdir / moe_config_filename(16, 256, dev, down=True),
                  {m: {**c, "USE_TMA": False} for m, c in cfg.items()})
    tiles = moe_configs.prepare_trial_tile_configs(tmp_path / "trial", tuned, include_shipped=True)
    env = {**os.environ, **{k: v for k, v in tiles.env().items() if v is not None}}
    log = tmp_path / "server.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
                                 "--load-format", "dummy", "--skip-tokenizer-init", "--attention-backend", "triton",
                                 "--sampling-backend", "pytorch", "--host", "127.0.0.1", "--port", "31877",
                                 "--mem-fraction-static", "0.3", "--disable-cuda-graph"],
                                env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert _wait("http://127.0.0.1:31877/health", proc), log.read_text()[-3000:]
        req = urllib.request.Request("http://127.0.0.1:31877/generate", data=json.dumps(
            {"input_ids": list(range(1, 40)), "sampling_params": {"max_new_tokens": 4}}).encode(),
            headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=120).read()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(60)
    proof = prove_loaded(log, tiles.expected, tiles.our_dirs)
    assert proof.loaded, proof.summary() + "\n" + log.read_text()[-3000:]


@pytest.mark.parametrize("M", [2, 64])
def test_a_stand_in_compile_serves_the_whole_shapes_launch(M, tmp_path, monkeypatch):
    """A config compiled by a pool process on the fewer-experts stand-in is not compiled again by the
    timer on the whole shape (fresh Triton cache, so every binary is counted)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    from tuner.kernels.sglang_compile import SGLangCompilePool, compile_stand_in
    from tuner.kernels.sglang_kernels import SGLangMoE
    from tuner.kernels.timing import GraphTimer

    shape = MoEShape(num_experts=97, intermediate=256, hidden=512, topk=5, dtype="fp8_w8a8",
                     block_shape=(128, 128), fused_shared_experts=1)
    assert compile_stand_in(shape, M).num_experts < shape.num_experts
    cfg = (TileConfig(16, 64, 128, 1, 4, 3), DownTileConfig(16, 128, 128, 1, 4, 2, USE_TMA=False))
    with SGLangCompilePool("moe", shape, workers=1) as pool:
        pool.ensure([(M, cfg)])
        assert pool.failed(M, cfg) is None
    timer = GraphTimer(SGLangMoE(shape))
    timer.measure(M, cfg)
    assert timer.compiled_here == 0
    timer.measure(M, (TileConfig(32, 64, 128, 1, 4, 3), DownTileConfig(32, 128, 128, 1, 4, 2, USE_TMA=False)))
    assert timer.compiled_here > 0  # the count sees a binary the pool did not build


def test_a_collapsed_routing_sends_every_token_to_the_pool_and_the_shared_slot():
    from tuner.kernels.sglang_kernels import Routing, SGLangMoE, reference_moe

    shape = MoEShape(num_experts=33, intermediate=256, hidden=512, topk=5, dtype="bf16", fused_shared_experts=1)
    p = SGLangMoE(shape, routing=Routing.COLLAPSED, routed_pool=6, rotations=2)
    for r in range(2):
        _, ids, _ = p.batch(64)["rotations"][r]
        routed = ids[:, :-1]
        assert len(torch.unique(routed)) <= 6  # the same few routed experts for every token
        assert bool((ids[:, -1] == 32).all())  # the fused shared slot, always
        assert bool((routed < 32).all())
    up = TileConfig(16, 64, 64, 1, 4, 3)
    with p.using(up):
        out = p.launch(64, None, 0).float()
    torch.testing.assert_close(out, reference_moe(p, 64, 0), rtol=2e-2, atol=2e-2)


def test_compare_times_a_directorys_files_against_sglangs_default(tmp_path):
    import triton

    from tuner.kernels.configfile import moe_config_filename, write_configs
    from tuner.kernels.sglang_compare import compare_moe

    shape = MoEShape(num_experts=33, intermediate=256, hidden=512, topk=5, dtype="bf16", fused_shared_experts=1)
    vdir = "triton_" + triton.__version__.split("+")[0].replace(".", "_")
    cfg = {m: {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
               "num_stages": 3} for m in (1, 256)}
    write_configs(tmp_path / "configs" / vdir / moe_config_filename(33, 256, torch.cuda.get_device_name(0)), cfg)
    doc = compare_moe(shape, [16, 256], tmp_path, routing="collapsed", routed_pool=6, rounds=2)
    assert [r["batch_size"] for r in doc["rows"]] == [16, 256]
    for r in doc["rows"]:
        assert r["default_us"] > 0 and r["files_us"] > 0
        assert r["files_vs_default"] == pytest.approx(r["files_us"] / r["default_us"], rel=0.5)
        assert r["configs"]["files"]["up"]["BLOCK_SIZE_M"] == 16
