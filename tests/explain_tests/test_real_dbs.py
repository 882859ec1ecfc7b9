"""What the committed real SGLang 0.5.17 studies on an H200 (results/h200-sglang/*.db) say at
each trial's capacity. The databases are copied (the committed files stay untouched) and read
through the same summary `study status`, the report and the dashboard use."""

import shutil

import pytest

from tests.conftest import REPO, run_cli
from tuner.storage import db
from tuner.study.summary import study_summary

RESULTS = REPO / "results" / "h200-sglang"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    for name in ("h200-sglang-qwen3", "h200-sglang-dsv3"):
        for suffix in ("", "-wal", "-shm"):
            src = RESULTS / f"{name}.db{suffix}"
            if src.exists():
                shutil.copy(src, tmp / src.name)
        db.upgrade(db.get_engine(f"sqlite:///{tmp}/{name}.db", create=False))  # committed at schema 1
    return tmp


def _summary(stored, name):
    s = study_summary(f"sqlite:///{stored}/{name}.db", name)
    return s, {t["number"]: t["bottleneck"] for t in s["trials"]}


def test_qwen3_is_bound_by_its_decode_step_with_a_pool_it_does_not_fill(stored):
    s, b = _summary(stored, "h200-sglang-qwen3")
    for n, at in ((0, "29.4 ms"), (1, "27.7 ms")):
        assert b[n]["bound"] == "missed_target" and b[n]["binding"] == "decode_step"
        assert b[n]["sentence"].startswith(f"misses P90 TPOT at 24 users ({at}, target 25 ms): decode step time")
        kv = next(f for f in b[n]["point"]["findings"] if f["cause"] == "kv_capacity")
        # 24 users hold ~0.23 M tokens of a 0.76 M (trial 0) / 1.34 M (trial 1) pool: not the pool
        assert kv["share"] == 0.0 and kv["coverage"] == "estimated"
        assert kv["figures"]["working_set_tokens"] < 0.5 * kv["figures"]["kv_pool_tokens_total"]
        missing = {m["cause"] for m in b[n]["not_measured"]}
        assert {"decode_step", "gpu_idle", "kv_capacity"} <= missing  # split, per-point NVML, reuse records
    # HiCache on (trial 1): its load-back was not broken out by cache tier in these metrics
    assert "host_link" in {m["cause"] for m in b[1]["not_measured"]}
    assert "host_link" not in {m["cause"] for m in b[0]["not_measured"]}
    # trial 7 (fp8 weights) met 24 users once, but its repeat (trial 15, another seed) only 16: the
    # best is the 16-user trial with the most headroom (trial 3, fp8 weights with HiCache), bound
    # by its decode step at 24 users
    assert s["not_reproduced"] == {"7": 16}
    assert s["best"]["number"] == 3 and s["bottleneck"] == b[3]
    assert b[3]["sentence"].startswith("misses P90 TPOT at 24 users (29.1 ms, target 25 ms): decode step time")
    assert b[7]["sentence"].startswith("misses P90 TPOT at 32 users (28.9 ms, target 25 ms): decode step time")


def test_dsv3_is_bound_by_prefill_compute_and_its_defaults_did_not_start(stored):
    s, b = _summary(stored, "h200-sglang-dsv3")
    for n in (0, 1):
        assert b[n]["bound"] == "did_not_serve" and b[n]["binding"] is None
        assert b[n]["sentence"].startswith("did not serve (oom): sglang exited with signal SIGKILL during startup")
        assert "(while capturing decode CUDA graphs after the KV pool" in b[n]["sentence"]
    t2 = b[2]
    assert t2["binding"] == "prefill_compute"
    assert t2["sentence"].startswith("misses P90 TTFT at 16 users (1.41 s, target 1 s): 75% of TTFT is prefill compute")
    queue = next(f for f in t2["point"]["findings"] if f["cause"] == "prefill_queueing")
    # SGLang's own histograms: 56.8 s of queue time over 226.8 s of TTFT
    assert queue["coverage"] == "measured" and queue["share"] == pytest.approx(56.809782 / 226.77106)
    # trial 3 (interrupted after one point) misses TPOT by 0.8 ms: decode waits behind prefills
    assert b[3]["binding"] == "prefill_interference" and "P90 TPOT 20.8 ms" in b[3]["sentence"]
    # every load point carries its own sentence
    t = next(t for t in s["trials"] if t["number"] == 2)
    assert [m["why"][:30] for m in sorted(t["measurements"], key=lambda m: m["users"])] == [
        "meets both targets at 8 users:", "misses P90 TTFT at 16 users (1"]


def test_study_status_shows_why_and_answers_what_if_on_the_real_study(stored):
    storage = f"sqlite:///{stored}/h200-sglang-qwen3.db"
    r = run_cli(["study", "status", "h200-sglang-qwen3", "--storage", storage, "--slo", "ttft=1.5,tpot=0.030"])
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "#0 B: misses P90 TPOT at 24 users (29.4 ms, target 25 ms): decode step time" in out
    assert "not measured for trial 3:" in out  # the best's
    assert "trial 7's 24 users were not reproduced: the same configuration served 16 in a repeat" in out
    # at TPOT 30 ms trial 0 still misses 32 users (34.8 ms); trial 1 meets it (29.9 ms), nothing above was measured
    assert "best at these targets: trial 1, at least 32 users" in out
