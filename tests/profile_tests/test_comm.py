"""Collective tables (`tuner profile comm`): the plan, the document and its checks, interpolation, and
the step-time model taking its communication from a table where one covers the group (CPU; the
timing itself is in test_gpu_comm.py)."""

import pytest
from click.testing import CliRunner

from tuner.catalog import get_gpu, get_model
from tuner.cli import cli, main
from tuner.errors import ConfigError
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.profile.comm import DEFAULT_SIZES_BYTES, CommPlan, comm_document
from tuner.profile.runner import write_profile
from tuner.sim.calibrate import load_calibration
from tuner.sim.optable import COMM_OPS, OpTables, load_profile, parse_profile, tables_for_gpu
from tuner.sim.steptime import RankWork, StepTimeModel

SIZES = (1024, 65536, 4 << 20, 64 << 20)


def times(plan, scale=1.0):
    # a collective's time: latency plus bytes over a bandwidth, per op (all_to_all slowest)
    bw = {"all_reduce": 300e3, "all_gather": 500e3, "reduce_scatter": 500e3, "all_to_all": 200e3}  # bytes/us
    return {op: [scale * (8.0 + s / bw[op]) for s in plan.sizes_bytes] for op in plan.ops}


def comm_file(tmp_path, gpus=8, scale=1.0, sizes=SIZES, name="comm.json", gpu="h200"):
    plan = CommPlan(gpus=gpus, sizes_bytes=sizes)
    doc = comm_document(plan, gpu=gpu, device_name="NVIDIA H200", times_us=times(plan, scale),
                        provenance={"note": "hand-made times for a CPU test"})
    return write_profile(doc, tmp_path / name), plan


def test_a_communication_profile_needs_no_sglang_version_and_round_trips(tmp_path):
    path, plan = comm_file(tmp_path)
    pf = load_profile(path)
    assert pf.sglang_version == "" and pf.attention_backend == ""
    assert {t.op for t in pf.tables} == set(COMM_OPS)
    assert all(t.shape == {"gpus": 8, "nodes": 1} and t.axes == ("bytes",) for t in pf.tables)
    ar = next(t for t in pf.tables if t.op == "all_reduce")
    assert ar.lookup_us(65536) == pytest.approx(8.0 + 65536 / 300e3, abs=1e-3)  # stored to the ns
    assert pf.provenance["library"] == "nccl" and pf.provenance["tool"] == "tuner profile comm"


def test_between_below_and_above_the_grid(tmp_path):
    pf = load_profile(comm_file(tmp_path)[0])
    ar = next(t for t in pf.tables if t.op == "all_reduce")
    lo, hi = ar.lookup_us(65536), ar.lookup_us(4 << 20)
    mid = (65536 + (4 << 20)) / 2
    assert ar.lookup_us(mid) == pytest.approx((lo + hi) / 2)  # linear in bytes between points
    assert ar.lookup_us(16) == ar.lookup_us(1024)  # below: latency-bound, the smallest message's time
    top, below_top = ar.lookup_us(64 << 20), ar.lookup_us(4 << 20)
    slope = (top - below_top) / ((64 << 20) - (4 << 20))
    assert ar.lookup_us(128 << 20) == pytest.approx(top + slope * (64 << 20))  # above: bandwidth-bound, linear


def test_sizes_round_to_whole_elements_per_gpu_and_bad_plans_name_the_option():
    plan = CommPlan(gpus=8, sizes_bytes=(1000, 4096))
    assert plan.sizes_bytes == (1008, 4096) and plan.sizes_rounded == {1000: 1008}
    assert CommPlan(gpus=1).sizes_bytes == DEFAULT_SIZES_BYTES
    with pytest.raises(ConfigError) as err:
        CommPlan(gpus=8, ops=("all_reduce", "broadcast"))
    assert err.value.key == "--ops" and "broadcast" in str(err.value)
    with pytest.raises(ConfigError) as err:
        CommPlan(gpus=8, sizes_bytes=(4096, 4096))
    assert err.value.key == "--sizes"
    with pytest.raises(ConfigError) as err:
        CommPlan(gpus=0)
    assert err.value.key == "--gpus"
    with pytest.raises(ValueError):  # a run that lost a collective's row
        comm_document(plan, gpu="h200", device_name="x", times_us={"all_reduce": [1.0, 2.0]}, provenance={})


@pytest.mark.parametrize("shape, key", [({"gpus": 8}, "ops[0].shape"), ({"gpus": 0, "nodes": 1}, "ops[0].shape"),
                                        ({"gpus": True, "nodes": 1}, "ops[0].shape")])
def test_collective_tables_need_a_group_size(shape, key):
    doc = {"format": "tuner-op-profile/1", "gpu": "h200", "provenance": {"note": "hand-made"},
           "ops": [{"op": "all_reduce", "shape": shape, "axes": ["bytes"], "grid": {"bytes": [1024, 4096]},
                    "us": [9.0, 10.0]}]}
    with pytest.raises(ConfigError) as err:
        parse_profile(doc, "bad.json")
    assert err.value.key == key


def test_operator_files_still_need_their_sglang_version():
    doc = {"format": "tuner-op-profile/1", "gpu": "h200", "provenance": {"note": "hand-made"},
           "ops": [{"op": "sampling", "shape": {"vocab": 1000}, "axes": ["batch"], "grid": {"batch": [1, 2]},
                    "us": [9.0, 10.0]}]}
    with pytest.raises(ConfigError) as err:
        parse_profile(doc, "bad.json")
    assert err.value.key == "sglang_version"


def glm(flags, tables):
    m, g = get_model("glm-5.1"), get_gpu("h200")
    plan = plan_memory(m, g, 8, flags)
    return StepTimeModel(m, g, resolve_checkpoint(m, flags.get("quantization")), parse_layout(m, flags, 8),
                         plan.bytes_per_token, load_calibration("h200"), gpus_per_node=8, op_tables=tables)


TP8 = {"tp-size": 8, "quantization": "modelopt_fp4"}
DP8_DEEPEP = {"tp-size": 8, "attn-dp-size": 8, "ep-size": 8, "quantization": "modelopt_fp4", "moe-a2a-backend": "deepep"}
DP8_GATHER = {"tp-size": 8, "attn-dp-size": 8, "quantization": "modelopt_fp4"}


def test_tp_all_reduce_comes_from_the_table_of_its_group(tmp_path):
    analytic = glm(TP8, OpTables.empty())
    nbytes = 64 * analytic.h * 2  # a 64-request decode step's hidden states
    want = analytic.comm_lat + 2 * 7 / 8 * nbytes / analytic.link_bw
    assert analytic.all_reduce_s(8, nbytes) == pytest.approx(want)
    work = RankWork(decode_reqs=64, decode_ctx_tokens=64 * 8000)
    base = analytic.rank_time(work)
    assert analytic.source_summary()["communication"] == "analytic"

    tables = OpTables([load_profile(comm_file(tmp_path)[0])])
    measured = glm(TP8, tables)
    table_s = next(t for t in tables.files[0].tables if t.op == "all_reduce").lookup_s(nbytes)
    assert measured.all_reduce_s(8, nbytes) == pytest.approx(table_s) and table_s != pytest.approx(want)
    # two all-reduces per layer, the rest of the rank's step unchanged
    assert measured.rank_time(work) - base == pytest.approx(2 * measured.layers * (table_s - want))
    src = measured.source_summary()
    assert src["communication"] == "profile" and str(tables.files[0].path) in src["profiles"]


def test_a_table_of_another_group_size_or_gpu_leaves_the_analytic_time(tmp_path):
    four = OpTables([load_profile(comm_file(tmp_path, gpus=4)[0])])
    b200 = tmp_path / "b200"
    comm_file(b200, gpu="b200")
    other_gpu = tables_for_gpu("h200", extra_dirs=(str(b200),))  # a folder's other GPUs are not read
    assert not other_gpu.files
    for tables in (four, other_gpu):
        sm = glm(TP8, tables)
        sm.rank_time(RankWork(decode_reqs=8, decode_ctx_tokens=8000))
        assert sm.source_summary()["communication"] == "analytic"


def test_attention_dp_dispatch_and_combine_use_their_collectives(tmp_path):
    tables = OpTables([load_profile(comm_file(tmp_path)[0])])
    by_op = {t.op: t for t in tables.files[0].tables}
    tokens = 512
    deepep_a, deepep_t = glm(DP8_DEEPEP, OpTables.empty()), glm(DP8_DEEPEP, tables)
    send = tokens / 8 * deepep_a.moe_k * deepep_a.h
    old = deepep_a.moe_layers * (2 * deepep_a.comm_lat + 3 * send * 7 / 8 / deepep_a.link_bw)
    assert deepep_a.moe_comm_time(tokens) == pytest.approx(old)  # fp8 dispatch + bf16 combine
    assert deepep_t.moe_comm_time(tokens) == pytest.approx(
        deepep_t.moe_layers * (by_op["all_to_all"].lookup_s(send) + by_op["all_to_all"].lookup_s(2 * send)))
    gather_a, gather_t = glm(DP8_GATHER, OpTables.empty()), glm(DP8_GATHER, tables)
    nbytes = tokens * gather_a.h * 2
    assert gather_a.moe_comm_time(tokens) == pytest.approx(
        gather_a.moe_layers * 2 * (gather_a.comm_lat + 7 / 8 * nbytes / gather_a.link_bw))
    assert gather_t.moe_comm_time(tokens) == pytest.approx(
        gather_t.moe_layers * (by_op["all_gather"].lookup_s(nbytes) + by_op["reduce_scatter"].lookup_s(nbytes)))
    # the MoE layer's time carries its communication
    assert gather_t.moe_time(tokens) - gather_a.moe_time(tokens) == pytest.approx(
        gather_t.moe_comm_time(tokens) - gather_a.moe_comm_time(tokens))


def test_one_gpu_has_no_communication():
    m, g = get_model("qwen3-30b-a3b"), get_gpu("h200")
    flags = {"tp-size": 1}
    plan = plan_memory(m, g, 1, flags)
    sm = StepTimeModel(m, g, resolve_checkpoint(m, None), parse_layout(m, flags, 1), plan.bytes_per_token,
                       load_calibration("h200"), gpus_per_node=1, op_tables=OpTables.empty())
    sm.step_time([RankWork(decode_reqs=8, decode_ctx_tokens=8000)], 8)
    assert sm.source_summary()["communication"] == "none"


def test_show_says_a_file_of_collectives_is_the_machines(tmp_path):
    path, _ = comm_file(tmp_path)
    r = CliRunner().invoke(cli, ["profile", "show", str(path)])
    assert r.exit_code == 0 and "collectives (nccl) between 8 GPU(s)" in r.output and "SGLang" not in r.output
    assert "all_to_all" in r.output


def test_cli_plans_without_a_gpu_and_names_bad_options(tmp_path, capsys):
    r = CliRunner().invoke(cli, ["profile", "comm", "--gpus", "8", "-o", str(tmp_path / "c.json"), "--dry-run",
                                 "--sizes", "4KiB,1MiB,64MiB"])
    assert r.exit_code == 0 and "4 collectives x 3 sizes (4096 B to 67108864 B) over 8 GPU(s)" in r.output
    assert not (tmp_path / "c.json").exists()
    r = CliRunner().invoke(cli, ["profile", "comm", "--gpus", "8", "-o", str(tmp_path / "c.json"), "--sizes", "4KB"])
    assert r.exit_code == 2 and "--sizes" in r.output
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "comm", "--gpus", "8", "-o", str(tmp_path / "c.json"), "--ops", "gather"])
    err = capsys.readouterr().err
    assert exit_.value.code != 0 and "--ops" in err and "'gather'" in err and "all_gather" in err
