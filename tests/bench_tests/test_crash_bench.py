"""`tuner bench crash`, once, as a user runs it: real drivers killed with kill -9 and stopped with
SIGTERM mid-measurement. The counts it reports are the issue's targets (0 lost, 0 left), and they
are not vacuous: the killed driver did leave servers behind for the resume to reap."""

import json

from tests.conftest import run_cli
from tuner.bench.crash import format_lines


def test_bench_crash_loses_nothing_and_leaves_nothing_after_kill_9_and_sigterm(tmp_path):
    r = run_cli(["bench", "crash", "--repeats", "1", "--json"], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    k, t = doc["kill_9"], doc["sigterm"]
    assert doc["passed"] and doc["repeats"] == 1 and len(k["runs"]) == 1 and len(t["runs"]) == 1
    assert k["processes_left_at_kill"] >= 1, "the kill came mid-measurement: a trial server was running"
    assert (k["trials_lost"], k["measurements_lost"], k["trials_left_running"], k["orphans"]) == (0, 0, 0, 0)
    assert k["resumed_ok"] and k["runs"][0]["kill_to_taken_over_s"] is not None, "the resume took the study over"
    assert k["kill_to_taken_over_s"]["median"] <= k["kill_to_budget_spent_s"]["median"]
    assert t["processes_at_signal"] >= 1
    assert (t["trials_lost"], t["trials_left_running"], t["orphans"], t["leases_left"]) == (0, 0, 0, 0)
    assert t["exit_codes"] == [143] and t["runs"][0]["trials_interrupted"] == 1
    kill_line, term_line = format_lines(doc)
    assert kill_line.startswith("kill -9 (1x): trials lost 0, measurements lost 0, left running 0, orphans 0 (of ")
    assert "every resume exit 0: yes" in kill_line
    assert term_line.startswith("SIGTERM (1x): trials lost 0, left running 0, orphans 0 (of ")
    assert "exit codes [143]" in term_line


def test_bench_crash_help_and_a_bad_repeat_count(tmp_path):
    r = run_cli(["bench", "crash", "--help"], cwd=tmp_path)
    assert r.returncode == 0 and "--repeats" in r.stdout and "--ray" in r.stdout
    r = run_cli(["bench", "crash", "--repeats", "0"], cwd=tmp_path)
    assert r.returncode == 2 and "--repeats" in r.stderr
