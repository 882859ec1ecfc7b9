"""`tuner simulate` and `tuner serve-sim` run one simulator core: on the same requests they produce
the same schedule (which batch runs when, every first token and every finish)."""

import pytest

from tuner.catalog import get_gpu, get_model
from tuner.planner import parse_layout, plan_memory
from tuner.sim.cache import SessionPrefixCache
from tuner.sim.calibrate import calibration_context, load_calibration
from tuner.sim.engine import Rank, ReplicaEngine, Req, Stats
from tuner.sim.online import build_online_engine
from tuner.sim.router import Router, SessionIndex, routing_policy
from tuner.sim.simulate import build_step_model, scheduler_rules

SYS = 64  # shared system prefix, in tokens (a multiple of the 16-token page)
SESSIONS = [(300 + 97 * s, [120, 80], 24 + 3 * s) for s in range(6)]  # (first new tokens, later new, output)


def _offline(model, gpu, flags, knobs, capacity, version):
    m, g = get_model(model), get_gpu(gpu)
    plan = plan_memory(m, g, 8, {**flags, "max-total-tokens": capacity}, sglang_version=version)
    layout = parse_layout(m, flags, 8)
    rules = scheduler_rules(plan, layout, flags, version)
    cal = load_calibration(g.name, context=calibration_context(m, g, flags, version))  # as both simulators resolve it
    step_model = build_step_model(m, g, plan, layout, flags, knobs, cal, 8, version)
    done = []
    host = plan.hicache_host_tokens_per_pool if rules.hierarchical_cache else 0  # as simulate_load_point sizes it
    ranks = [Rank(SessionPrefixCache(plan.kv_capacity_tokens_per_gpu, plan.page_size, SYS, host), rules)
             for _ in range(layout.attn_dp)]
    eng = ReplicaEngine(ranks, step_model, rules, stats=Stats(), on_finish=lambda r, t: done.append((r, t)),
                        max_jump=1)
    router = Router(routing_policy(flags, knobs), len(ranks), SessionIndex(len(ranks), SYS))

    def submit(session, turn, prompt_len, out):
        out = rules.clamp_max_new_tokens(prompt_len, out, plan.kv_capacity_tokens_per_gpu, plan.context_length)
        req = Req(0, session, turn, eng.clock, prompt_len, out)
        r = ranks[router.route(req, [x.inflight for x in ranks], [x.inflight_tokens for x in ranks])]
        r.inflight += 1
        r.inflight_tokens += prompt_len
        r.waiting.append(req)
        return req

    return eng, submit, done, plan


def _online(model, gpu, flags, knobs, capacity, version):
    engine, plan = build_online_engine(model, gpu, 8, {**flags, "max-total-tokens": capacity}, knobs,
                                       sglang_version=version)
    rep = engine.replicas[0]
    done = []

    def step():
        engine._pending = []
        dt = rep.step()
        done.extend((req, rep.clock) for req, tok, _ in engine._pending if tok is None)
        return dt

    return engine, rep, step, done, plan


def _at(req, clock):
    """The online engine stamps arrivals with the wall clock; stepped by hand here, its requests
    arrive at the engine's own clock, as the offline ones do."""
    req.arrival = clock
    return req


def _run(model, gpu, flags, knobs, capacity, version="0.5.23", out_scale=1):
    """Drive both engines with the same closed-loop sessions (next turn as soon as a turn ends)."""
    eng, submit_off, done_off, plan = _offline(model, gpu, flags, knobs, capacity, version)
    online, rep, step_on, done_on, _ = _online(model, gpu, flags, knobs, capacity, version)
    sys_ids = list(range(1000, 1000 + SYS))
    off, on = {}, {}
    for s, (first, _, out) in enumerate(SESSIONS):
        out *= out_scale
        ids = sys_ids + [5000 + 10_000 * s + i for i in range(first)]
        off[(s, 0)] = submit_off(s, 0, len(ids), out)
        on[(s, 0)] = _at(online.submit(ids, out), rep.clock)
    seen_off, seen_on = 0, 0
    for _ in range(5000):
        if not eng.has_work() and not rep.has_work():
            break
        dt_off = eng.step()
        dt_on = step_on()
        assert dt_off == pytest.approx(dt_on), "the two engines ran different batches"
        for (req_off, _), (req_on, _) in zip(done_off[seen_off:], done_on[seen_on:]):
            s, turn = req_off.session, req_off.turn
            assert on[(s, turn)] is req_on
            if turn + 1 < 1 + len(SESSIONS[s][1]):
                new = SESSIONS[s][1][turn]
                out = SESSIONS[s][2] * out_scale
                ids = req_on.tokens[:req_on.input_len + req_on.output_len] + \
                    [7000 + 10_000 * s + 100 * turn + i for i in range(new)]
                off[(s, turn + 1)] = submit_off(s, turn + 1, len(ids), out)
                on[(s, turn + 1)] = _at(online.submit(ids, out), rep.clock)
        seen_off, seen_on = len(done_off), len(done_on)
    assert len(done_off) == len(done_on) == sum(1 + len(t) for _, t, _ in SESSIONS)
    return off, on, eng, rep


@pytest.mark.parametrize("flags,knobs,capacity,version", [
    # one pool with room for everything
    ({"tp-size": 1, "page-size": 16}, {}, 200_000, "0.5.23"),
    # a small pool: sessions are evicted and re-prefilled
    ({"tp-size": 1, "page-size": 16}, {}, 2_400, "0.5.23"),
    # ... and with 0.5.17's optimistic reservation, decode runs out of KV: requests are retracted
    ({"tp-size": 1, "page-size": 16, "schedule-conservativeness": 0.2}, {}, 2_000, "0.5.17"),
    # a small pool with HiCache: evicted sessions come back from the host, and every inserted prefix
    # is backed up first (the scheduler's write-through time holds the step behind it)
    ({"tp-size": 1, "page-size": 16, "enable-hierarchical-cache": True, "hicache-ratio": 4}, {}, 2_400, "0.5.17"),
    # two attention-DP pools behind cache-aware routing
    ({"tp-size": 2, "attn-dp-size": 2, "page-size": 16}, {"router-policy": "cache_aware"}, 200_000, "0.5.23"),
])
def test_simulate_and_serve_sim_produce_the_same_schedule(flags, knobs, capacity, version):
    # long outputs (8x) when testing retraction: decode must outgrow what admission reserved
    off, on, eng, rep = _run("qwen3-30b-a3b", "h200", flags, knobs, capacity, version,
                             out_scale=8 if version == "0.5.17" else 1)
    for key, a in off.items():
        b = on[key]
        assert (a.cached, a.first_t, a.generated, a.retractions) == (b.cached, b.first_t, b.generated, b.retractions), key
    offline_only = {"reprefill_tokens"}  # needs session ids, which live requests do not carry
    assert {k: v for k, v in eng.stats.__dict__.items() if k not in offline_only | {"window"}} == \
        {k: v for k, v in rep.stats.__dict__.items() if k not in offline_only | {"window"}}
    # live requests arrive on the wall clock here while the engine's clock is stepped: no queue times
    not_compared = offline_only | {"queue_s"}
    assert {k: v for k, v in eng.stats.window.__dict__.items() if k not in not_compared} == \
        {k: v for k, v in rep.stats.window.__dict__.items() if k not in not_compared}
    assert [r.window for r in eng.ranks] == [r.window for r in rep.ranks]
    assert [r.cache.evicted_tokens for r in eng.ranks] == [r.cache.evicted_tokens for r in rep.ranks]
    if capacity < 10_000:
        assert sum(r.cache.evicted_tokens for r in eng.ranks) > 0
    if "schedule-conservativeness" in flags:
        assert eng.stats.retractions > 0
    if flags.get("enable-hierarchical-cache"):  # both loaded back from the host and wrote to it alike
        assert eng.stats.hicache_load_tokens > 0
        assert [r.cache.host_written for r in eng.ranks] == [r.cache.host_written for r in rep.ranks]
        assert eng.ranks[0].cache.host_written > 0


def test_default_routing_is_the_same_for_both():
    from tuner.sim.router import routing_policy as policy

    engine, _ = build_online_engine("qwen3-30b-a3b", "h200", 8, {"tp-size": 2, "attn-dp-size": 2}, {})
    assert engine.router.policy == policy({"tp-size": 2}, {}) == "round_robin"
