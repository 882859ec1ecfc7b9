import numpy as np

from tuner.workload.profiles import load_profile
from tuner.workload.session import (
    PromptBuilder,
    TokenSpace,
    generate_session,
    generate_sessions,
    prompt_token_ids,
)


def _sessions(n=5, seed=0):
    return generate_sessions(load_profile("coding-agent").model_copy(update={"scale": 0.02}), n, seed)


def test_same_seed_same_traffic_and_different_seed_differs():
    a, b = _sessions(seed=3), _sessions(seed=3)
    assert a == b
    assert prompt_token_ids(a[1], 2, seed=3) == prompt_token_ids(b[1], 2, seed=3)
    assert prompt_token_ids(a[1], 0, seed=3) != prompt_token_ids(a[1], 0, seed=4)


def test_generate_session_matches_list():
    prof = load_profile("coding-agent")
    assert generate_session(prof, 7, seed=2) == generate_sessions(prof, 10, seed=2)[7]


def test_system_prefix_shared_across_sessions_and_turns_extend_previous_prompt():
    ss = _sessions()
    n = ss[0].system_prefix_tokens
    p0 = prompt_token_ids(ss[0], 0)
    q0 = prompt_token_ids(ss[1], 0)
    assert n > 0 and p0[:n] == q0[:n]
    assert p0[n:] != q0[n:len(p0)]  # the sessions' own content differs
    s = next(x for x in ss if x.num_turns >= 3)
    for k in range(1, 3):
        prev, cur = prompt_token_ids(s, k - 1), prompt_token_ids(s, k)
        assert cur[: len(prev)] == prev  # whole previous prompt re-sent
        assert len(cur) == s.prompt_tokens(k)
        out = PromptBuilder(s, TokenSpace()).output_for(k - 1).tolist()
        assert cur[len(prev): len(prev) + len(out)] == out  # then the previous response


def test_received_output_ids_replace_synthetic_ones():
    s = next(x for x in _sessions() if x.num_turns >= 2)
    received = [7] * 5
    p = prompt_token_ids(s, 1, vocab_size=32000, received_output_ids={0: received})
    start = s.system_prefix_tokens + s.turns[0].new_tokens
    assert p[start:start + 5] == received


def test_reserved_ids_never_sent():
    s = _sessions(1)[0]
    reserved = set(range(1000, 1050))
    ids = np.array(prompt_token_ids(s, s.num_turns - 1, vocab_size=1100, reserved_ids=reserved))
    assert ids.min() >= 1050 and ids.max() < 1100
    tiny = np.array(prompt_token_ids(s, 0, vocab_size=50, reserved_ids={0, 1, 2}))
    assert tiny.min() >= 3 and tiny.max() < 50  # small vocabularies still work
