import json

import pytest

from tests.workload_tests.conftest import DATA
from tuner.errors import ConfigError
from tuner.workload.importers import detect_format, load_trace
from tuner.workload.trace import trace_stats

STAT_KEYS = {"requests", "sessions", "input_tokens", "output_tokens", "turns_per_session", "prefix_reuse_ratio"}


@pytest.mark.parametrize("name, fmt", [
    ("mooncake_conversation_head.jsonl", "mooncake"),
    ("azure_code_head.csv", "azure"),
    ("claude_code_requests_excerpt.csv", "weka-csv"),
    ("kvcache_tester_trace_0598.json", "kvcache-tester"),
    ("sharegpt_small.json", "sharegpt"),
    ("sessions_small.jsonl", "jsonl"),
])
def test_detect_and_stats_on_excerpts(name, fmt):
    path = DATA / name
    assert detect_format(path) == fmt
    s = trace_stats(load_trace(path))
    assert STAT_KEYS <= set(s)
    assert s["requests"] > 0 and s["sessions"] > 0
    for key in ("input_tokens", "output_tokens"):
        assert set(s[key]) == {"mean", "median", "p90", "p99"}
        assert s[key]["median"] <= s[key]["p90"] <= s[key]["p99"]
    assert set(s["turns_per_session"]) == {"mean", "median", "max"}
    if fmt == "azure":
        assert s["prefix_reuse_ratio"] is None and s["turns_per_session"]["max"] == 1
    else:
        assert 0.0 <= s["prefix_reuse_ratio"] < 1.0


def test_sharegpt_turns_resend_conversation():
    t = load_trace(DATA / "sharegpt_small.json")
    c1 = t.sessions()["c1"]
    assert [r.turn for r in c1] == [0, 1]
    assert c1[1].input_tokens > c1[0].input_tokens + c1[0].output_tokens


def test_mooncake_hash_chains_make_sessions():
    t = load_trace(DATA / "mooncake_conversation_head.jsonl")
    multi = [s for s in t.sessions().values() if len(s) > 1]
    assert multi, "follow-up turns should be linked"
    for reqs in multi:
        a, b = reqs[0], reqs[1]
        full = a.input_tokens // 512
        assert b.hash_ids[:full] == a.hash_ids[:full] and b.timestamp_s >= a.timestamp_s


def test_shared_traces(shared_traces):
    expect = {
        "mooncake_conversation_trace.jsonl": (12031, 0.30, 0.45),
        "mooncake_synthetic_trace.jsonl": (3993, 0.3, 0.9),
        "AzureLLMInferenceTrace_code_2023.csv": (8819, None, None),
        "AzureLLMInferenceTrace_conv_2023.csv": (19366, None, None),
        "claude_code_weka_requests.csv": (49334, 0.9, 1.0),
        "claude_code_weka": (327, 0.9, 1.0),
    }
    for name, (n, lo, hi) in expect.items():
        s = trace_stats(load_trace(shared_traces / name))
        assert s["requests"] == n, name
        if lo is None:
            assert s["prefix_reuse_ratio"] is None
        else:
            assert lo <= s["prefix_reuse_ratio"] <= hi, name
    cc = trace_stats(load_trace(shared_traces / "claude_code_weka_requests.csv"))
    assert 90_000 < cc["input_tokens"]["median"] < 120_000
    assert cc["sessions"] == 773  # 710 main agents + 63 sub-agents


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_malformed_line_names_line_and_skip_bad_counts(tmp_path):
    good = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})
    p = _write(tmp_path, "t.jsonl", "\n".join([good, good, "{not json", good]) + "\n")
    with pytest.raises(ConfigError, match="line 3") as err:
        load_trace(p)
    assert err.value.exit_code == 2 and str(p) in str(err.value)
    t = load_trace(p, skip_bad=True)
    assert len(t.requests) == 3 and t.skipped_lines == 1


@pytest.mark.parametrize("line, why", [
    ('{"session_id": 1, "turn": 0, "input_tokens": -5, "output_tokens": 3}', "must be >= 1"),
    ('{"session_id": 1, "turn": 0, "output_tokens": 3}', "missing 'input_tokens'"),
    ('{"session_id": 1, "turn": 0, "input_tokens": "x", "output_tokens": 3}', "not a number"),
])
def test_bad_lengths(tmp_path, line, why):
    good = '{"session_id": 1, "turn": 0, "input_tokens": 10, "output_tokens": 3}'
    p = _write(tmp_path, "s.jsonl", good + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=f"line 2: .*{why}"):
        load_trace(p)


def test_csv_bad_row_and_empty_and_unknown(tmp_path):
    p = _write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,10,1\n2023-11-16 18:17:04,-1,2\n")
    with pytest.raises(ConfigError, match="line 3"):
        load_trace(p)
    with pytest.raises(ConfigError, match="empty"):
        load_trace(_write(tmp_path, "e.jsonl", ""))
    with pytest.raises(ConfigError, match="unrecognised CSV header"):
        load_trace(_write(tmp_path, "u.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(ConfigError, match="valid formats"):
        load_trace(p, "parquet")
    with pytest.raises(ConfigError, match="no such file"):
        load_trace(tmp_path / "missing.jsonl")


def test_all_bad_lines_skipped_is_an_error(tmp_path):
    p = _write(tmp_path, "b.jsonl", '{"session_id": 1}\n{"session_id": 2}\n')
    with pytest.raises(ConfigError, match="2 bad records skipped"):
        load_trace(p, "jsonl", skip_bad=True)
