import numpy as np
import pytest

from tuner.workload.loadgen_server import LoadgenProcess, ServerConfig
from tuner.workload.profiles import load_profile
from tuner.workload.replay import replay_closed_loop, run_load_point, run_sync

# Small sessions and short think times so a load point takes a couple of seconds.
PROFILE = load_profile("coding-agent").model_copy(update={"scale": 0.02})
RATE = 200.0  # tokens/s per stream: 5 ms per token
TTFT = 0.05


@pytest.fixture(scope="module")
def server():
    with LoadgenProcess(ServerConfig(token_rate_per_s=RATE, ttft_s=TTFT)) as url:
        yield url


@pytest.mark.parametrize("transport", ["fast", "aiohttp"])
def test_latencies_follow_server_pacing_and_prefix_cache_hits(server, transport):
    r = run_sync(replay_closed_loop(server, PROFILE, 4, warmup_s=0.5, duration_s=2.5, time_scale=0.02,
                                    transport=transport))
    m = r.metrics
    assert m.valid and m.errors == 0 and m.requests >= 8
    assert TTFT <= m.p50_ttft_s < TTFT + 0.03
    assert 1 / RATE * 0.8 < m.p50_tpot_s < 1 / RATE * 1.5
    assert 1 / RATE * 0.5 < m.p50_itl_s < 1 / RATE * 1.5
    assert m.throughput_tokens_per_s > 0
    # Every later turn re-sends its conversation, and all sessions share the system prefix.
    assert m.prefix_cache_hit_rate > 0.5
    later = [x for x in r.records if x.turn > 0]
    assert later and all(x.cached_tokens >= 64 for x in later)
    assert all(x.output_tokens == PROFILE_OUT(x) for x in r.records)
    assert m.extra["client_bound"] in (True, False) and "event_loop_lag_p99_s" in m.extra


def PROFILE_OUT(rec):
    from tuner.workload.session import generate_session

    # Users take sessions u, u+U, ...: the session id is the index in the deterministic list.
    return generate_session(PROFILE, rec.session_id, 0).turns[rec.turn].output_tokens


def test_closed_loop_concurrency_never_exceeds_users(server):
    r = run_sync(replay_closed_loop(server, PROFILE, 3, warmup_s=0.2, duration_s=1.5, time_scale=0.0))
    assert 1 <= r.max_in_flight <= 3
    assert r.metrics.extra["max_in_flight"] <= 3


def test_generate_api_and_server_output_ids(server):
    r = run_sync(replay_closed_loop(server, PROFILE, 2, warmup_s=0.2, duration_s=1.5, time_scale=0.02,
                                    api="generate", use_server_output_ids=True))
    assert r.metrics.valid and r.metrics.errors == 0
    assert all(x.cached_tokens is not None for x in r.records)


@pytest.mark.parametrize("transport", ["fast", "aiohttp"])
def test_dropped_connections_are_errors_not_zero_latency(transport):
    with LoadgenProcess(ServerConfig(token_rate_per_s=RATE, ttft_s=0.01, drop_every=2)) as url:
        r = run_sync(replay_closed_loop(url, PROFILE, 4, warmup_s=0.2, duration_s=1.5, time_scale=0.0,
                                        max_error_rate=0.05, transport=transport))
    m = r.metrics
    assert m.errors >= m.requests // 4 > 0
    failed = [x for x in r.records if not x.ok]
    assert all(x.ttft_s is None and x.error for x in failed)
    assert not m.valid and "error rate" in m.invalid_reason


def test_ignore_eos_can_be_omitted():
    with LoadgenProcess(ServerConfig(token_rate_per_s=RATE, ttft_s=0.01, reject_ignore_eos=True)) as url:
        bad = run_load_point(url, PROFILE, 2, warmup_s=0.1, duration_s=0.8, time_scale=0.0)
        good = run_load_point(url, PROFILE, 2, warmup_s=0.1, duration_s=0.8, time_scale=0.0, send_ignore_eos=False)
    assert not bad.valid and bad.errors == bad.requests
    assert good.valid and good.errors == 0


def test_unreachable_server_is_invalid_not_fast():
    m = run_load_point("http://127.0.0.1:9", PROFILE, 2, warmup_s=0.0, duration_s=0.5, time_scale=0.0,
                       request_timeout_s=2)
    assert not m.valid and m.p90_ttft_s is None


def test_text_prompts(server):
    r = run_sync(replay_closed_loop(server, PROFILE, 2, warmup_s=0.1, duration_s=1.0, time_scale=0.0,
                                    prompt_format="text"))
    assert r.metrics.valid and np.isfinite(r.metrics.p50_ttft_s)


def test_requests_starved_since_the_warm_up_count_in_the_window():
    # the first two requests (sent in the warm-up) get their first token only after the window opened:
    # a window that counted only the requests started in it would not see its slowest ones
    warmup, stall = 0.5, 1.5
    with LoadgenProcess(ServerConfig(token_rate_per_s=RATE, ttft_s=0.01, stall_first=2, stall_s=stall)) as url:
        r = run_sync(replay_closed_loop(url, PROFILE, 4, warmup_s=warmup, duration_s=2.0, time_scale=0.02))
    m = r.metrics
    carried = [x for x in r.records if x.carried_in]
    assert len(carried) == 2 and m.extra["carried_in_requests"] == 2
    assert all(x.start_s < warmup <= x.start_s + x.ttft_s and x.ttft_s >= stall for x in carried)
    # the warm-up's other requests had their first token before the window: not counted
    assert all(x.start_s >= warmup for x in r.records if not x.carried_in)
    assert m.p99_ttft_s >= stall and m.valid
    # throughput is the window's own requests
    started = [x for x in r.records if x.ok and not x.carried_in]
    assert m.throughput_tokens_per_s == pytest.approx(sum(x.output_tokens for x in started) / 2.0)
