"""GPU checks of our fused-MoE Triton kernel against the torch reference, and a short tune."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tuner.kernels.space import TileConfig  # noqa: E402

CONFIGS = [TileConfig(16, 32, 64, 1, 4, 2), TileConfig(64, 128, 128, 16, 8, 3), TileConfig(128, 64, 64, 32, 4, 4)]


def _routing(M, E, topk, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w, ids = torch.softmax(torch.randn(M, E, generator=g, device="cuda"), -1).topk(topk, -1)
    return w, ids.to(torch.int32)


def _rel(out, ref):
    assert torch.isfinite(out.float()).all()
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("M", [1, 7, 200])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.short())
def test_bf16_matches_reference(M, cfg):
    from tuner.kernels.reference import reference_moe
    from tuner.kernels.triton_moe import fused_moe

    E, N, K, topk = 9, 192, 320, 3  # N and K not multiples of every tile: masked edges, uneven K
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
    w1 = (torch.randn(E, 2 * N, K, generator=g, device="cuda") / K**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, K, N, generator=g, device="cuda") / N**0.5).to(torch.bfloat16)
    tw, ti = _routing(M, E, topk, M + 1)
    out = fused_moe(x, w1, w2, tw, ti, cfg)
    assert _rel(out, reference_moe(x, w1, w2, tw, ti)) < 1e-2


@pytest.mark.parametrize("M", [3, 300])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.short())
def test_fp8_block_matches_reference(M, cfg):
    from tuner.kernels.reference import reference_moe
    from tuner.kernels.triton_moe import fused_moe, quantize_fp8_weight_blocks

    E, N, K, topk, bs = 17, 256, 512, 4, (128, 128)
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, generator=g, device="cuda").to(torch.bfloat16)
    q1, s1 = quantize_fp8_weight_blocks(torch.randn(E, 2 * N, K, generator=g, device="cuda") / K**0.5, *bs)
    q2, s2 = quantize_fp8_weight_blocks(torch.randn(E, K, N, generator=g, device="cuda") / N**0.5, *bs)
    tw, ti = _routing(M, E, topk, M + 2)
    out = fused_moe(x, q1, q2, tw, ti, cfg, w1_scale=s1, w2_scale=s2, block_shape=bs, fp8=True)
    ref = reference_moe(x, q1, q2, tw, ti, w1_scale=s1, w2_scale=s2, block_shape=bs, fp8=True)
    assert _rel(out, ref) < 3e-2


def test_alignment_pads_each_expert_to_block():
    from tuner.kernels.triton_moe import moe_align_block_size

    ids = torch.tensor([[0, 2], [2, 3], [0, 2]], dtype=torch.int32, device="cuda")
    a = moe_align_block_size(ids, 4, 5)
    assert a.num_tokens_post_padded.item() == 12  # experts 0, 2, 3 -> 3 blocks of 4
    sorted_ids = a.sorted_token_ids[:12].tolist()
    assert sorted_ids[:4] == [0, 4, 6, 6] and sorted_ids[4:8] == [1, 2, 5, 6] and sorted_ids[8:] == [3, 6, 6, 6]
    assert a.expert_ids[:3].tolist() == [0, 2, 3]


def test_short_tune_writes_sglang_file(tmp_path):
    from click.testing import CliRunner

    from tuner.cli.kernels import kernels

    # our look-alike kernel (--impl own): where SGLang is importable, auto would time SGLang's own
    res = CliRunner().invoke(kernels, ["tune", "--model", "qwen3-235b-a22b", "--tp-size", "8", "--dtype", "bf16",
                                       "--impl", "own", "--batch-sizes", "1,64", "--budget", "6", "-o", str(tmp_path),
                                       "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    path = tmp_path / doc["config_file"] if not doc["config_file"].startswith("/") else doc["config_file"]
    data = json.loads(open(path).read())
    assert sorted(data) == ["1", "64"]
    assert all(r["evaluations"] <= 6 and r["best_us"] > 0 for r in doc["results"])
    assert "E=128,N=192,device_name=" in str(path)
