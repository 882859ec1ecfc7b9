"""The kernel warm-up: which prompt lengths reach every fused-MoE kernel variant, and what it sends
to a real streaming server on loopback."""

import socket

import pytest

from tuner.kernels.targets import SGLANG_BATCH_SIZES
from tuner.workload.kernel_warmup import MAX_FAILURES_IN_A_ROW, prompt_lengths, run_kernel_warmup
from tuner.workload.loadgen_server import LoadgenProcess, ServerConfig


def test_every_key_and_its_other_parity_up_to_the_limit():
    assert prompt_lengths([1, 2, 4, 8, 16], 100) == [1, 2, 3, 4, 5, 8, 9, 16, 17]
    assert prompt_lengths([16, 1, 16, 4], 5) == [1, 2, 4, 5]
    lengths = prompt_lengths(SGLANG_BATCH_SIZES, 4097)
    # each key of SGLang's config files with both parities of M x top-k / 16 (even top-k)
    assert all(k in lengths and k + 1 in lengths for k in SGLANG_BATCH_SIZES)
    assert max(lengths) == 4097 and len(lengths) == len(set(lengths))


@pytest.mark.parametrize("keys,limit", [([], 10), ([0, 4], 10), ([4], 0)])
def test_bad_keys_or_limit_are_refused(keys, limit):
    with pytest.raises(ValueError):
        prompt_lengths(keys, limit)


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_one_uncached_prompt_per_length_to_a_real_server(api):
    lengths = prompt_lengths([1, 16, 64, 256], 257)
    with LoadgenProcess(ServerConfig(token_rate_per_s=500, ttft_s=0.01)) as url:
        r = run_kernel_warmup(url, lengths, api=api, vocab_size=1000, seed=3)
        again = run_kernel_warmup(url, lengths, api=api, vocab_size=1000, seed=3)
    assert r.failed == 0 and r.requests == len(lengths) == 8
    assert r.prompt_tokens == sum(lengths) and r.max_prompt_tokens == 257
    # fresh random ids: the server's prefix cache finds nothing to reuse, so a prefill's M is its prompt
    assert r.cached_prompt_tokens == 0
    assert again.cached_prompt_tokens >= 64  # the same prompts again: the server's cache does see them
    assert 0 < r.slowest_request_s <= r.seconds


def test_a_dead_server_is_given_up_after_a_few_failures():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    r = run_kernel_warmup(f"http://127.0.0.1:{port}", prompt_lengths(SGLANG_BATCH_SIZES, 4097),
                          request_timeout_s=5)
    assert r.requests == r.failed == MAX_FAILURES_IN_A_ROW and r.first_error
