import json

import yaml
from click.testing import CliRunner

from tests.workload_tests.conftest import DATA
from tuner.cli import cli, main


def _run(args):
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def test_stats_json_contract():
    r = _run(["workload", "stats", str(DATA / "claude_code_requests_excerpt.csv"), "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    for key in ("input_tokens", "output_tokens"):
        assert set(doc[key]) == {"mean", "median", "p90", "p99"}
    assert set(doc["turns_per_session"]) == {"mean", "median", "max"}
    assert doc["requests"] == 756 and 0.9 < doc["prefix_reuse_ratio"] <= 1.0


def test_stats_format_override_and_text_output():
    r = _run(["workload", "stats", str(DATA / "sessions_small.jsonl"), "--format", "jsonl"])
    assert r.exit_code == 0 and "prefix reuse" in r.output


def test_bad_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"session_id": 1, "turn": 0, "input_tokens": 5, "output_tokens": 1}\nnot json\n')
    for args in (["workload", "stats", str(bad)], ["workload", "stats", str(DATA / "azure_code_head.csv"), "--format", "nope"]):
        try:
            main(args)
        except SystemExit as exc:
            assert exc.code == 2
        else:
            raise AssertionError("expected exit 2")
    assert "line 2" in capsys.readouterr().err
    r = _run(["workload", "stats", str(bad), "--skip-bad", "--json"])
    assert json.loads(r.output)["skipped_lines"] == 1


def test_fit_writes_loadable_profile(tmp_path):
    out = tmp_path / "w" / "mine.yaml"
    r = _run(["workload", "fit", str(DATA / "sessions_small.jsonl"), "-o", str(out), "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert set(doc["fits"]) == {"first_turn_context_tokens", "new_tokens_per_turn", "output_tokens_per_turn",
                                "turns_per_session", "think_time_s"}
    assert all(set(f) >= {"mu", "sigma", "ks_statistic"} for f in doc["fits"].values())
    assert {"data", "model"} <= set(doc["input_tokens_per_turn"])
    from tuner.workload.profiles import load_profile

    prof = load_profile(out)
    assert prof.name == "mine" and prof.new_tokens_per_turn.mu == doc["fits"]["new_tokens_per_turn"]["mu"]
    assert "KS statistic" in out.read_text() and yaml.safe_load(out.read_text())["name"] == "mine"


def test_show_and_list():
    r = _run(["workload", "show", "coding-agent", "--sessions", "50", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["profile"]["name"] == "coding-agent"
    r = _run(["workload", "list", "--json"])
    assert {"coding-agent", "claude-code"} <= {x["name"] for x in json.loads(r.output)}


def test_bench_client_json_contract():
    r = _run(["bench", "client", "--streams", "20", "--duration", "1", "--rate", "50",
              "--max-added-latency-p99-ms", "1000", "--json"])
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["max_concurrent_streams"] == 20
    assert doc["tokens_per_s"] > 20 * 50 * 0.5
    assert doc["added_latency_p99_ms"] is not None and doc["added_latency_p99_ms"] >= 0
