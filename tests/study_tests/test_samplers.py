"""The default sampler's planner-ranked seeds: one per parallelism family, in rounds over KV-pool counts."""

from __future__ import annotations

from tuner.config.load import load_study
from tuner.planner import plan_memory
from tuner.catalog import get_gpu, get_model
from tuner.study import space as space_mod
from tuner.study.samplers import _rounds_by_pool_count, seed_configs


def _family(name: str) -> dict:
    dp, _, ep = name.partition("-ep")
    return {"name": name, "attn-dp-size": int(dp.removeprefix("dp") or 1) if dp != "tp" else 1,
            "ep-size": int(ep) if ep else None}


def test_rounds_take_every_pool_count_before_a_second_family_of_any():
    families = [(900.0, 8, _family("dp8-ep1")), (850.0, 8, _family("dp8-ep8")), (700.0, 4, _family("dp4-ep1")),
                (650.0, 4, _family("dp4-ep8")), (500.0, 2, _family("dp2")), (200.0, 1, _family("tp"))]
    order = [v["name"] for _, _, v in _rounds_by_pool_count(families)]
    assert order == ["dp8-ep1", "dp4-ep1", "dp2", "tp", "dp8-ep8", "dp4-ep8"]
    # room alone would have cut plain TP at six seeds less one
    assert [v["name"] for _, _, v in sorted(families, key=lambda f: -f[0])][:5].count("tp") == 0
    assert _rounds_by_pool_count([]) == []


def test_between_equal_rooms_experts_split_by_ep_come_first():
    """EP gives each GPU whole experts; moe-TP slices them, and a slice's down GEMM is 1/TP as deep."""
    families = [(900.0, 8, _family("dp8-ep1")), (900.0, 8, _family("dp8-ep8")), (700.0, 4, _family("dp4-ep1")),
                (700.0, 4, _family("dp4-ep8")), (200.0, 1, _family("tp"))]
    order = [v["name"] for _, _, v in _rounds_by_pool_count(families)]
    assert order == ["dp8-ep8", "dp4-ep8", "tp", "dp8-ep1", "dp4-ep1"]


def _pools(study, values) -> int:
    space = study.space()
    flags, _ = space_mod.split(values, space.engine, space_mod.pinned_flags(study))
    hw = study.hardware
    plan = plan_memory(get_model(study.model), get_gpu(hw.gpu), hw.gpus_per_node, flags, nodes=hw.nodes,
                       host_memory_gb=hw.host_memory_gb)
    return plan.kv_pools


def test_h200_seeds_cover_every_kv_pool_count_of_the_space_first():
    study = load_study("h200")
    seeds = seed_configs(study)
    assert len(seeds) == 6
    pools = [_pools(study, s) for s in seeds]
    counts = sorted(set(pools))
    assert len(counts) >= 2
    first_round = pools[:len(counts)]
    assert sorted(first_round) == counts, f"every pool count once before any repeats: {pools}"
    # the single-pool (plain TP) family is among the seeds, with its roomiest memory settings
    tp = seeds[pools.index(1)]
    assert tp["attn-dp-size"] == 1 and tp["enable-hierarchical-cache"] is True
