"""SGLang's Triton split-KV decode kernel: the batch waits for its longest request's chain of splits."""

import numpy as np
import pytest

from tuner.catalog import get_gpu, get_model
from tuner.errors import ConfigError
from tuner.planner import parse_layout, plan_memory, resolve_checkpoint
from tuner.sim.cache import SessionPrefixCache
from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.ctxspread import decode_contexts, spread_from_contexts
from tuner.sim.engine import Rank, ReplicaEngine, Req, Stats
from tuner.sim.scheduler import SchedulerRules
from tuner.sim.optable import OpTables, load_profile as load_op_profile
from tuner.sim.stepfit import TrialSteps, _decode_work
from tuner.sim.steptime import RankWork, StepTimeModel, triton_decode_splits
from tuner.sim.wholesteps import read_whole_step_sets
from tuner.workload.profiles import load_profile

from tests.conftest import REPO
from tests.sim_tests.test_stepfit import FLAGS


def test_splits_follow_sglang_get_num_kv_splits_triton():
    # Qwen3 on 132 SMs: 4 head groups, at most 8 splits. 32k tokens: 132 x log2(512) = 1,188 cores
    assert triton_decode_splits(1, 32768, 32768, 4, 8, 132) == 8
    assert triton_decode_splits(32, 32768, 32768, 4, 8, 132) == 8  # cdiv(1188, 128) = 10, capped
    assert triton_decode_splits(64, 32768, 32768, 4, 8, 132) == 5  # cdiv(1188, 256)
    assert triton_decode_splits(128, 32768, 32768, 4, 8, 132) == 3
    assert triton_decode_splits(512, 32768, 32768, 4, 8, 132) == 1
    # lengths 15x apart: the longest is split by its ratio to the shortest (capped at 8)
    assert triton_decode_splits(128, 30000, 2000, 4, 8, 132) == 8
    # within 25% of each other they count as equal
    assert triton_decode_splits(128, 32768, 30000, 4, 8, 132) == 3
    # MLA: 8 groups of 16 heads, the split cap raised to 256
    assert triton_decode_splits(1, 32768, 32768, 8, 256, 132) == 149
    # short contexts: log2 floored at 1
    assert triton_decode_splits(1, 64, 64, 4, 8, 132) == 8
    assert triton_decode_splits(100, 64, 64, 4, 8, 132) == 1


def _step_model(model="qwen3-30b-a3b", flags=FLAGS, **cal_overrides):
    t = TrialSteps(label="x#0", study="x", trial=0, model=get_model(model), gpu=get_gpu("h200"), gpus=1, nodes=1,
                   host_memory_gb=128, flags=dict(flags), knobs={}, sglang_version="0.5.17", shared_prefix_tokens=0)
    cal = load_calibration("h200")
    cal.update(cal_overrides)
    return t.step_model(cal)


def test_small_batches_wait_for_the_longest_request():
    sm = _step_model()
    assert sm.split_kv and sm.decode_head_groups == 4 and sm.decode_max_splits == 8
    one = sm.decode_attention_time(1, 32768)
    # four requests of the same length run side by side: no longer than one (within the table's
    # 3.15 blocks an SM, 4 x 4 groups x 8 splits = 128 blocks fill fewer than 416 lanes)
    assert sm.decode_attention_time(4, 4 * 32768) == pytest.approx(one)
    # and the step grows with the longest context, not the batch's total
    assert sm.decode_attention_time(1, 16384) == pytest.approx(one / 2, rel=0.01)
    # one long request among short ones costs what the long one costs alone
    mixed = sm.decode_attention_time(8, 32768 + 7 * 2000, max_ctx=32768, min_ctx=2000)
    assert mixed == pytest.approx(one) and mixed > 3 * sm.decode_attention_time(8, 8 * 5846)
    # beyond the lanes the batch streams: 512 requests take 512 / lanes-worth of one
    big = sm.decode_attention_time(512, 512 * 32768)
    stream = 512 * 32768 * max(sm.decode_attn_flops / sm.decode_attn_rate, sm.cell / sm.kv_bw)
    assert big == pytest.approx(stream)
    assert big / one == pytest.approx(512 * 4 * 8 / sm.decode_lanes, rel=0.01)


def test_the_latency_term_can_be_turned_off_and_other_backends_stream():
    off = _step_model(decode_attention_blocks_per_sm=0)
    assert not off.split_kv
    assert off.decode_attention_time(4, 4 * 32768) == pytest.approx(4 * off.decode_attention_time(1, 32768))
    # the measured rate of the table: at 1 request of 32k tokens about 276 us a layer on the H200
    on = _step_model()
    assert on.decode_attention_time(1, 32768) > 4 * off.decode_attention_time(1, 32768)


def test_the_decode_kernel_latency_reaches_the_step_time():
    sm = _step_model()
    short = sm.step_time([RankWork(decode_reqs=4, decode_ctx_tokens=4 * 4000)], 4)
    long_one = sm.step_time([RankWork(decode_reqs=4, decode_ctx_tokens=3 * 4000 + 32000,
                                      decode_max_ctx_tokens=32000, decode_min_ctx_tokens=4000)], 4)
    spread = sm.step_time([RankWork(decode_reqs=4, decode_ctx_tokens=3 * 4000 + 32000)], 4)  # at the mean
    assert long_one > spread > short
    # the memo keys on the longest and shortest too: asking again in the other order agrees
    assert sm.step_time([RankWork(decode_reqs=4, decode_ctx_tokens=3 * 4000 + 32000)], 4) == spread


class _RecordingSteps:
    def __init__(self):
        self.decodes = []

    def step_time(self, works, running, overlap=True):
        w = works[0]
        if w.decode_reqs and not w.prefill_tokens:
            self.decodes.append((w.decode_reqs, w.decode_ctx_tokens, w.decode_max_ctx_tokens,
                                 w.decode_min_ctx_tokens))
        return 0.1 if w.prefill_tokens else 0.01

    def write_gate_s(self, works, dt):
        return 0.0

    def host_write_cpu_s(self, tokens, gate_s=0.0):
        return 0.0

    def source_summary(self):
        return {}


def test_the_engine_tracks_the_longest_and_shortest_running_context():
    rules = SchedulerRules.for_version("0.5.17", page_size=1, chunked_prefill_size=8192, max_running_requests=10,
                                       attn_dp=1, flags={"disable-overlap-schedule": True})
    rank = Rank(SessionPrefixCache(100000, 1, 0, 0), rules)
    model = _RecordingSteps()
    eng = ReplicaEngine([rank], model, rules, stats=Stats(), on_finish=lambda r, t: None, max_jump=1)
    for session, (inp, out) in enumerate([(3000, 5), (1000, 40), (200, 40)]):
        rank.inflight += 1
        rank.waiting.append(Req(0, session, 0, 0.0, inp, out))
    for _ in range(30):
        eng.step()
    # the first decode reads each prompt; every step adds a token to each
    assert model.decodes[:2] == [(3, 4200, 3000, 200), (3, 4203, 3001, 201)]
    # the 3,000-token request finishes after its 5 tokens (4 decode steps): the 1,000-token one is
    # then the longest, and the two that are left move together
    assert model.decodes[4] == (2, 1208, 1004, 204)
    n, ctx, hi, lo = model.decodes[-1]
    assert n == 2 and hi - lo == 800 and ctx == hi + lo and hi > 1004


def test_the_workload_spread_gives_a_logged_batch_its_longest_context():
    profile = load_profile("coding-agent")
    ctx, weight = decode_contexts(profile, sessions=60)
    spread = spread_from_contexts(ctx, weight, max_batch=32, draws=100)
    assert spread.hi[0] == pytest.approx(1.0) and spread.lo[0] == pytest.approx(1.0)
    assert all(a <= b + 1e-9 for a, b in zip(spread.hi[1:8], spread.hi[2:9]))  # grows with the batch
    assert spread.hi[15] > 1.3 and spread.lo[15] < 0.8
    hi, lo = spread.extremes(16, 16 * 10000)
    assert hi > 10000 > lo
    assert spread.extremes(1000, 1000 * 10000) == spread.extremes(32, 32 * 10000)  # beyond the table: its last
    w = _decode_work(16, 160000, 0, spread)
    assert (w.decode_max_ctx_tokens, w.decode_min_ctx_tokens) == (hi, lo)
    # every turn alike: no spread
    flat = spread_from_contexts(np.full(50, 5000.0), np.ones(50), max_batch=8, draws=10)
    assert flat.hi == flat.lo == (1.0,) * 8


def test_a_measured_table_is_read_at_the_mean_and_at_the_longest_alone():
    table_file = REPO / "results/profiles/h200/tables/qwen3-30b-a3b-tp1-fp8-fp8kv-triton-0.5.17.json"
    flags = {"tp-size": 1, "attention-backend": "triton", "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3"}
    m, g = get_model("qwen3-30b-a3b"), get_gpu("h200")
    plan = plan_memory(m, g, 1, flags, sglang_version="0.5.17")
    sm = StepTimeModel(m, g, resolve_checkpoint(m, "fp8"), parse_layout(m, flags, 1), plan.bytes_per_token,
                       load_calibration("h200"), gpus_per_node=1, kv_cache_dtype=plan.kv_cache_dtype,
                       sglang_version="0.5.17", flags=flags, op_tables=OpTables([load_op_profile(table_file)]))
    table = sm.decode_table
    assert table is not None
    # every request at the mean: the table's cell
    assert sm.decode_attention_time(8, 8 * 8192) == pytest.approx(table.lookup_s(8, 8192) * 48)
    # one 32k-token request among 4k-token ones: the long one alone (8 splits alone and here)
    ctx = 32768 + 7 * 4096
    assert sm.decode_attention_time(8, ctx, max_ctx=32768, min_ctx=4096) == pytest.approx(
        table.lookup_s(1, 32768) * 48)
    assert table.lookup_s(1, 32768) > 2 * table.lookup_s(8, ctx / 8)


def test_twice_the_kv_splits_halve_the_measured_chain_as_modelled():
    # SGLang's one-batch benchmark on the H100 (results/h100-sglang/decode-probe-2): a lone
    # 32k-token request decodes in 19.3 ms with 8 KV splits and 12.4 ms with 16
    sets = {ws.label: ws for ws in read_whole_step_sets(REPO / "results/h100-sglang/decode-probe-2/whole-steps.yaml")}
    eight, sixteen = sets["decode-probe-2/one-batch-ctx32k.jsonl"], sets["decode-probe-2/one-batch-splits16-ctx8k32k.jsonl"]

    def lone_32k(ws, **cal_overrides):
        step = next(s for s in ws.steps if s.kind == "decode" and s.batch == 1 and s.tokens > 32000)
        cal = load_calibration("h100", context=calibration_context(ws.model, ws.gpu, ws.flags, ws.sglang_version))
        cal.update(cal_overrides)
        return ws.predicted_s(cal, [step])[0], step.seconds

    (p8, m8), (p16, m16) = lone_32k(eight), lone_32k(sixteen)
    assert m16 / m8 == pytest.approx(0.64, abs=0.01)
    assert p16 / p8 == pytest.approx(m16 / m8, abs=0.08)
    # streaming alone, the flag would change nothing
    assert lone_32k(sixteen, decode_attention_blocks_per_sm=0)[0] == pytest.approx(
        lone_32k(eight, decode_attention_blocks_per_sm=0)[0])


@pytest.mark.parametrize("value", ["many", 0, -8, 2.5, True])
def test_a_bad_kv_split_flag_is_a_clear_error(value):
    with pytest.raises(ConfigError) as exc:
        _step_model(flags={**FLAGS, "triton-attention-num-kv-splits": value})
    assert exc.value.key == "triton-attention-num-kv-splits"


def test_the_kv_split_flag_sets_the_cap():
    sm = _step_model(flags={**FLAGS, "triton-attention-num-kv-splits": "16"})
    assert sm.decode_max_splits == 16 and sm.decode_splits(1, 32768) == 16


def test_mla_takes_sglangs_raised_split_cap_and_eight_head_groups():
    sm = _step_model("deepseek-v3", {"attention-backend": "triton", "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3"})
    # 128 heads over one latent in blocks of 16; next_pow2(132 SMs) = 256 splits at most
    assert (sm.decode_head_groups, sm.decode_max_splits) == (8, 256)
    # so a lone 32k-token request already fills the lanes: it streams
    one = sm.decode_attention_time(1, 32768)
    per_token = max(sm.decode_attn_flops / sm.decode_attn_rate, sm.cell / sm.kv_bw)
    assert sm.decode_splits(1, 32768) == 149 and one == pytest.approx(32768 * per_token)
