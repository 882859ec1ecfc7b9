"""SGLang's scheduling rules against small hand-worked traces (one rank, fixed step times)."""

import pytest

from tuner.sim.cache import SessionPrefixCache
from tuner.sim.engine import Rank, ReplicaEngine, Req, Stats
from tuner.sim.scheduler import SchedulerRules, check_version


class FixedSteps:
    """0.1 s per prefill step, 0.01 s per decode step; remembers what each step ran."""

    def __init__(self, write_s_per_token=0.0, queue_tokens=None, copy_s_per_token=0.0):
        self.log = []
        self.write_s_per_token = write_s_per_token
        self.written = []
        self.gates = []
        self.queue_tokens = queue_tokens  # backed-up tokens queued before the CPU waits for copies
        self.copy_s_per_token = copy_s_per_token

    def host_write_cpu_s(self, tokens, gate_s=0.0):
        self.written.append(tokens)
        self.gates.append(gate_s)
        issue = self.write_s_per_token * tokens
        if self.queue_tokens is None or tokens <= self.queue_tokens:
            return issue
        return max(issue, gate_s + (tokens - self.queue_tokens) * self.copy_s_per_token)

    def write_gate_s(self, works, dt):
        return dt if works[0].prefill_tokens else 0.0  # decodes replay CUDA graphs

    def step_time(self, works, running, overlap=True):
        w = works[0]
        self.log.append(("prefill" if w.prefill_tokens else "decode", w.prefill_tokens, w.decode_reqs,
                         list(w.extend_items), w.load_tokens))
        return 0.1 if w.prefill_tokens else 0.01

    def source_summary(self):
        return {}


def make(version="0.5.17", capacity=1000, page=1, chunk=512, max_running=10, overlap=False, host=0,
         write_s_per_token=0.0, queue_tokens=None, copy_s_per_token=0.0, **flags):
    flags = {"disable-overlap-schedule": not overlap, **flags}
    rules = SchedulerRules.for_version(version, page_size=page, chunked_prefill_size=chunk,
                                       max_running_requests=max_running, attn_dp=1, flags=flags,
                                       hierarchical_cache=host > 0)
    rank = Rank(SessionPrefixCache(capacity, page, 0, host), rules)
    finished = []
    model = FixedSteps(write_s_per_token, queue_tokens, copy_s_per_token)
    eng = ReplicaEngine([rank], model, rules, stats=Stats(), on_finish=lambda r, t: finished.append((r, t)),
                        max_jump=1)
    return eng, rank, finished, model


def add(rank, session, input_len, output_len, t=0.0):
    r = Req(0, session, 0, t, input_len, output_len)
    rank.inflight += 1
    rank.waiting.append(r)
    return r


def test_versions_resolve_to_the_rules_read_from_them():
    assert check_version(None) == "0.5.23"
    assert check_version("0.5.17") == "0.5.17" and check_version("0.5.17.post1") == "0.5.17"
    assert check_version("0.5.23") == "0.5.23" and check_version("0.5.25") == "0.5.23"
    r17 = make("0.5.17")[1].rules
    assert r17.init_new_token_ratio == 0.7 and r17.min_new_token_ratio == pytest.approx(0.098)
    assert r17.new_token_ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    assert not r17.ignore_eos_full_reserve and make("0.5.23")[1].rules.ignore_eos_full_reserve
    dp = SchedulerRules.for_version("0.5.23", page_size=1, chunked_prefill_size=1024, max_running_requests=8,
                                    attn_dp=8, flags={})
    assert dp.init_new_token_ratio == pytest.approx(0.7 * 0.3)  # schedule_conservativeness x 0.3 under DP attention


def test_admission_reserves_running_output_times_new_token_ratio_in_0517():
    # A (300 in, 200 out) runs; B (300, 200) needs 300 + 200 + 1 page = 501 tokens.
    # Free 700 (A's prompt is in the tree, locked); A still needs 199 tokens.
    # 0.5.17 reserves 199 x 0.7 = 139.3 for A: 501 < 700 - 139.3, B is admitted at once.
    eng, rank, _, model = make("0.5.17")
    a = add(rank, 1, 300, 200)
    eng.step()
    assert model.log[-1][:2] == ("prefill", 300) and a.first_t == pytest.approx(0.1)
    b = add(rank, 2, 300, 200)
    eng.step()
    assert model.log[-1][:3] == ("prefill", 300, 0)  # a prefill batch runs; A does not decode in it
    assert b.first_t is not None and not rank.waiting


def test_0523_reserves_the_whole_output_of_ignore_eos_requests_and_waits_for_a_finish():
    # 0.5.23 reserves A's 199 remaining tokens in full: 700 - 199 = 501 is not > 501, so B waits,
    # the batch is marked full, and B is not retried until A leaves (however long A decodes).
    eng, rank, finished, model = make("0.5.23")
    a = add(rank, 1, 300, 200)
    eng.step()
    b = add(rank, 2, 300, 200)
    eng.step()
    assert model.log[-1][0] == "decode" and rank.batch_is_full and rank.waiting == [b]
    for _ in range(197):
        eng.step()
    assert rank.waiting == [b] and not finished  # A has decoded 198 of its 199 remaining tokens
    eng.step()  # A's last token: it leaves, its KV goes into the tree, the batch is no longer full
    assert finished and finished[0][0] is a and not rank.batch_is_full
    eng.step()
    assert model.log[-1][:2] == ("prefill", 300) and b.first_t is not None


def test_new_token_ratio_decays_per_decode_step_and_resets_when_idle():
    eng, rank, finished, _ = make("0.5.17")
    add(rank, 1, 100, 50)
    eng.step()  # prefill: no decay
    assert rank.ratio.current == 0.7
    for _ in range(10):
        eng.step()
    assert rank.ratio.current == pytest.approx(0.7 - 10 * (0.7 - 0.098) / 600)
    rank.ratio.decay_steps(10_000)
    assert rank.ratio.current == pytest.approx(0.098)  # floor: 0.7 x 0.14
    while not finished:
        eng.step()
    eng.step(horizon=99.0)  # nothing to do: on_idle resets the ratio
    assert rank.ratio.current == 0.7


def test_chunked_prefill_pages_and_the_leftover_chunk_budget():
    # chunk 256, page 16. A (600 in) is chunked 256 + 256 + 88; in A's last step the remaining
    # budget (256 - ceil16(88) = 160) admits B (100 in, ceil16 = 112) whole, in the same batch.
    eng, rank, _, model = make("0.5.17", page=16, chunk=256)
    a = add(rank, 1, 600, 10)
    b = add(rank, 2, 100, 10)
    eng.step()
    assert model.log[-1][3] == [(256, 0)] and rank.chunked is a
    eng.step()
    assert model.log[-1][3] == [(256, 256)]
    eng.step()
    assert model.log[-1][3] == [(88, 512), (100, 0)]
    assert a.first_t == pytest.approx(0.3) and b.first_t == pytest.approx(0.3) and rank.chunked is None


def test_retraction_frees_the_fewest_generated_longest_input_request_and_reestimates_the_ratio():
    # Pool of 200 tokens, conservativeness 0.01 (ratio 0.007) so that A (20 in), B (30 in) and
    # C (10 in), 100 tokens out each, are admitted one by one. After 46 decode steps 198 tokens are
    # used; the 47th step needs 3: retract. All have 47 tokens out, so the longest input (B) goes;
    # its 46 decode tokens are freed (not cached) and its prompt stays in the tree, unlocked: the 48
    # free tokens already cover the 2 remaining x 20 tokens SGLang evicts for. One is enough.
    # New ratio = (47 + 47 + 20 x 2) / (200 + 1).
    eng, rank, _, _ = make("0.5.17", capacity=200, **{"schedule-conservativeness": 0.01})
    a = add(rank, 1, 20, 100)
    eng.step()
    b = add(rank, 2, 30, 100)
    eng.step()
    c = add(rank, 3, 10, 100)
    eng.step()
    assert len(rank.running) == 3 and rank.cache.free() == 140
    for _ in range(46):
        eng.step()
    assert eng.stats.retractions == 0 and rank.cache.free() == 2
    eng.step()
    assert eng.stats.retractions == 1 and rank.waiting == [b] and b.retractions == 1
    assert set(rank.running.values()) == {a, c}
    assert b.prefill_len == 30 + 47 and b.generated == 47
    assert rank.ratio.current == pytest.approx((47 + 47 + 40) / 201)
    assert rank.cache.free() == 200 - 20 - 10 - 30 - 2 * 47  # A and C: 47 decode KV slots each after this step
    assert rank.cache.evictable == 30 and rank.cache.match(b) == (30, 0)
    eng.step()  # B needs 47 + 53 + 1 = 101 > 46 + 30 - 106 x 0.667: waits, batch full
    assert rank.batch_is_full and rank.waiting == [b]


def test_overlap_scheduler_frees_a_finished_request_one_step_late():
    eng, rank, finished, _ = make("0.5.17", overlap=True)
    a = add(rank, 1, 100, 3)
    eng.step()  # prefill: token 1 at 0.1 s
    eng.step()  # token 2 at 0.11
    eng.step()  # token 3 (last) at 0.12; the next batch was formed before this result was seen
    assert not finished and len(rank.running) == 1
    eng.step()
    assert finished and finished[0][1] == pytest.approx(0.12)  # the client saw the last token at 0.12
    # its KV (prompt + the two tokens decoded after the first) went into the tree
    assert rank.cache.alloc_tokens == 0 and rank.cache.branch[1] == 100 + 2


def test_prefill_runs_before_decode_unless_mixed_chunk():
    eng, rank, _, model = make("0.5.17")
    add(rank, 1, 100, 50)
    eng.step()
    add(rank, 2, 100, 50)
    eng.step()
    assert model.log[-1][:3] == ("prefill", 100, 0)
    eng2, rank2, _, model2 = make("0.5.17", **{"enable-mixed-chunk": True})
    add(rank2, 1, 100, 50)
    eng2.step()
    add(rank2, 2, 100, 50)
    eng2.step()
    assert model2.log[-1][:3] == ("prefill", 100, 1)  # the running request decodes inside the prefill batch


def test_max_running_requests_marks_the_batch_full():
    eng, rank, _, _ = make("0.5.17", max_running=2)
    for s in range(3):
        add(rank, s, 50, 20)
    eng.step()
    assert len(rank.running) == 2 and len(rank.waiting) == 1 and rank.batch_is_full


def test_hicache_loads_back_host_hits_of_at_least_ten_tokens():
    eng, rank, finished, model = make("0.5.17", capacity=1000, host=4000)
    a = add(rank, 1, 400, 2)
    while not finished:
        eng.step()
    rank.cache.evict(1000)  # the device copy is gone, the host copy stays (write-through)
    assert rank.cache.match(Req(0, 1, 0, 0, 600, 1)) == (0, 401)  # prompt + the token decoded after the first
    add(rank, 1, 600, 2)
    eng.step()
    assert model.log[-1][1] == 199 and model.log[-1][4] == 401  # 401 loaded (400 + 1 output), 199 computed
    # a host hit under 10 tokens is recomputed instead
    eng2, rank2, fin2, model2 = make("0.5.17", capacity=1000, host=4000)
    add(rank2, 1, 8, 1)
    while not fin2:
        eng2.step()
    rank2.cache.evict(1000)
    add(rank2, 1, 30, 1)
    eng2.step()
    assert model2.log[-1][1] == 30 and model2.log[-1][4] == 0


def test_hicache_write_through_delays_the_first_token_and_holds_the_next_step():
    # 1 ms per backed-up token. A (400 in, 3 out) prefills in 0.1 s; its 400 tokens are written to
    # the host before its first token is streamed: first token at 0.1 + 0.4. Without overlap the
    # next step (a 0.01 s decode) starts after that CPU work: it ends at 0.5 + 0.01.
    eng, rank, finished, model = make("0.5.17", capacity=1000, host=4000, write_s_per_token=1e-3)
    a = add(rank, 1, 400, 3)
    eng.step()
    assert model.written == [400]
    assert a.first_t == pytest.approx(0.5)
    assert eng.step() == pytest.approx(0.41) and eng.clock == pytest.approx(0.51)
    # at its finish the two decoded tokens are backed up as well (cache_finished_req)
    while not finished:
        eng.step()
    assert model.written[-1] == 2
    # no host pool: nothing is written and nothing is held
    eng2, rank2, _, model2 = make("0.5.17", capacity=1000, write_s_per_token=1e-3)
    b = add(rank2, 1, 400, 3)
    eng2.step()
    assert model2.written == [] and b.first_t == pytest.approx(0.1)
    assert eng2.step() == pytest.approx(0.01)


def test_overlap_hides_write_through_cpu_time_behind_the_step_launched_before_it():
    # with the overlap scheduler the decode after the prefill was launched before the write: it
    # lasts max(0.01, CPU time) -- 0.01 s for 5 tokens (5 ms), 0.4 s for 400 tokens
    for tokens, second_step in ((5, 0.01), (400, 0.4)):
        eng, rank, _, model = make("0.5.17", capacity=1000, host=4000, overlap=True, write_s_per_token=1e-3)
        a = add(rank, 1, tokens, 3)
        eng.step()
        assert eng.step() == pytest.approx(second_step)
        assert a.first_t == pytest.approx(0.1 + tokens * 1e-3)


def test_a_backup_longer_than_the_copy_queue_waits_for_the_prefill_launched_behind_it():
    # Overlap: A (400 in) prefills in [0, 0.1]; B arrived meanwhile, so the next step launched is B's
    # prefill (0.1 s), and A's backup is issued behind it. 1 us per token to issue, a queue of 100
    # tokens, then 0.1 ms per token copied once the write stream may start: when B's forward ends.
    # A's first token: 0.1 + max(0.4 ms, 0.1 + 300 x 0.1 ms) = 0.23 s, and the step after B's
    # prefill is held until then (B's own 300 tokens go the same way behind the decode after it).
    eng, rank, _, model = make("0.5.17", capacity=2000, host=8000, overlap=True, write_s_per_token=1e-6,
                               queue_tokens=100, copy_s_per_token=1e-4)
    a = add(rank, 1, 400, 5)
    b = add(rank, 2, 300, 5, t=0.05)
    assert eng.step() == pytest.approx(0.1) and a.first_t is None  # settled with the next step
    assert eng.step() == pytest.approx(0.13)  # B's prefill: 0.1, held to A's backup
    assert model.written[0] == 400 and model.gates[0] == pytest.approx(0.1)
    assert a.first_t == pytest.approx(0.23)
    # B's result is processed once the thread is free (0.23); behind a decode (a CUDA graph) its
    # copies start at once: its 300 tokens hold the thread 200 x 0.1 ms
    assert eng.step() == pytest.approx(0.02) and model.gates[1] == 0.0
    assert b.first_t == pytest.approx(0.23 + 0.02)
    # a backup the queue holds is only its issue time, whatever is launched behind it
    eng2, rank2, _, model2 = make("0.5.17", capacity=2000, host=8000, overlap=True, write_s_per_token=1e-6,
                                  queue_tokens=500, copy_s_per_token=1e-4)
    c = add(rank2, 1, 400, 5)
    add(rank2, 2, 300, 5, t=0.05)
    eng2.step()
    assert eng2.step() == pytest.approx(0.1)
    assert model2.gates[0] == pytest.approx(0.1) and c.first_t == pytest.approx(0.1 + 400e-6)


def test_a_chunked_prompt_is_backed_up_when_its_last_chunk_is_inserted():
    # 0.5.17 skips the hit count (and the write) of a chunked insert: 700 tokens at chunk 512 are
    # charged once, after the second chunk
    eng, rank, _, model = make("0.5.17", capacity=2000, host=8000, chunk=512, write_s_per_token=1e-4)
    a = add(rank, 1, 700, 2)
    eng.step()
    assert model.written == [] and a.first_t is None
    eng.step()
    assert model.written == [700] and a.first_t == pytest.approx(0.2 + 0.07)


def test_lpm_orders_by_longest_cached_prefix():
    eng, rank, finished, model = make("0.5.17", **{"schedule-policy": "lpm"}, max_running=1)
    add(rank, 1, 300, 1)
    while not finished:
        eng.step()
    add(rank, 2, 200, 1)  # no cached prefix
    add(rank, 1, 400, 1)  # 300 cached
    eng.step()
    assert model.log[-1][3] == [(100, 300)]  # session 1 first although it came second


@pytest.mark.timeout(120)
def test_a_prompt_sglang_can_never_admit_blocks_its_rank_and_times_out_instead_of_hanging():
    """A prompt under max_req_input_len (pool - 6) whose paged length plus a page fills the pool:
    SGLang clamps its output to 0 tokens and PrefillAdder still answers NO_TOKEN, so it waits for
    good and blocks its rank's queue. The simulation ends at its drain limit with those requests
    timed out (it used to spin for ever once no arrival was left)."""
    import math

    from tuner.sim import simulate_load_point
    from tuner.workload.session import LogNormal, WorkloadProfile

    def fixed(v):
        return LogNormal(mu=math.log(v), sigma=0.0, min=v, max=v)

    profile = WorkloadProfile(name="pool-filler", system_prefix_tokens=0, first_turn_context_tokens=fixed(21150),
                              new_tokens_per_turn=fixed(100), output_tokens_per_turn=fixed(50),
                              turns_per_session=fixed(2), think_time_s=fixed(1))
    flags = {"tp-size": 8, "attn-dp-size": 8, "ep-size": 1, "quantization": "fp8"}
    m = simulate_load_point("glm-5.1", "h200", 8, flags, {}, profile, 2, warmup_s=0, duration_s=20,
                            host_memory_gb=2048)
    assert m.extra["kv_capacity_tokens_per_pool"] == 21184  # 21,150 + 50 output would not fit; 21,150 < 21,178
    assert m.requests == 2 and m.errors == 2 and not m.valid
