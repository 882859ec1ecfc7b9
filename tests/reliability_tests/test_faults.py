"""Injected server faults through a real study: each failure is recorded with its class and the
study goes on; `--max-failures` stops a study that keeps failing (exit 1, a clear message).

Faults are injected with the serve-sim backend's testing aid ``backend_options.faults`` (trial
number -> fault); the servers are real `tuner serve-sim` processes on loopback.
"""

from __future__ import annotations

import json

from tests.reliability_tests._util import (
    kill_marked, marked_pids, new_mark, query, run_tuner, trial_rows, tuner_env, wait_until, write_study,
)

# Every configuration of this space is feasible and distinct, so trial numbers are launch order.
SPACE = {
    "engine": "sglang",
    "params": {
        "tp-size": {"values": [8]},
        "quantization": {"values": ["modelopt_fp4"]},
        "mem-fraction-static": {"low": 0.80, "high": 0.90},
    },
}

# time_scale 10: crash_after_s=10 / hang_after_s=5 are 1 s / 0.5 s of wall time after start-up,
# inside the first 1-second load point
FAULTS = {
    "1": ("exit_at_start", "exit_at_start"),
    "2": ("crash_after_s=10", "crash"),
    "3": ("hang_after_s=5", "hang"),
    "4": ("oom", "oom"),
    "5": ("slow_start_s=600", "startup_timeout"),
    "6": ("port_in_use", "port_in_use"),
}


def test_each_fault_is_classified_and_the_study_continues(tmp_path):
    mark = new_mark()
    study = write_study(tmp_path, "faults", trials=len(FAULTS) + 2, search_space=SPACE,
                        options={"startup_timeout_s": 5, "faults": {k: v[0] for k, v in FAULTS.items()}})
    db = tmp_path / "tuner.db"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--no-ray", "--json"],
                      cwd=tmp_path, env=tuner_env(mark), timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        outcome = json.loads(r.stdout)
        rows = trial_rows(db, "faults")
        recognised = {}
        for number, (fault, expected) in FAULTS.items():
            row = rows[int(number)]
            assert row["status"] == "failed", (fault, row)
            assert row["failure_class"] == expected, (fault, row["failure_class"], row["failure_reason"])
            assert row["failure_reason"], fault
            recognised[expected] = row["failure_reason"]
        assert len(recognised) == 6
        # the reasons say what happened, in the server's or the tuner's words
        assert "Segmentation fault" in recognised["crash"]
        assert "out of memory" in recognised["oom"]
        assert "not ready after 5 s" in recognised["startup_timeout"]
        assert "already taken" in recognised["port_in_use"]
        # the study went on around the failures: baseline and the last trial completed
        assert rows[0]["status"] == "complete" and rows[len(FAULTS) + 1]["status"] in ("complete", "pruned")
        assert outcome["trials_failed"] == len(FAULTS) and outcome["stopped_reason"] is None
        # the crashed trial measured something before it died; the server that hung was stopped
        assert query(db, "SELECT count(*) FROM tuner_measurements WHERE trial_number=0")[0][0] >= 1
        assert not (wait_until(lambda: not marked_pids(mark), 15) is not True and marked_pids(mark))
    finally:
        kill_marked(mark)


def test_max_failures_stops_a_failing_study(tmp_path):
    mark = new_mark()
    study = write_study(tmp_path, "always-failing", trials=6, search_space=SPACE,
                        options={"faults": {str(n): "exit_at_start" for n in range(6)}})
    db = tmp_path / "tuner.db"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--no-ray", "--max-failures", "2"],
                      cwd=tmp_path, env=tuner_env(mark), timeout=120)
        assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
        assert "Error: stopped after 2 failed trials (--max-failures 2)" in r.stderr
        assert "tuner study status always-failing" in r.stderr
        rows = trial_rows(db, "always-failing")
        assert len(rows) == 2 and all(t["failure_class"] == "exit_at_start" for t in rows.values())
        assert query(db, "SELECT status FROM tuner_studies")[0][0] == "stopped"
    finally:
        kill_marked(mark)
