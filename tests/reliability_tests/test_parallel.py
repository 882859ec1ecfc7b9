"""`--parallel K` above what the resources allow runs what fits, says so once, and never hangs:
the simulator backend on the driver's local Ray (its CPUs), and without Ray (one at a time).
A trial that needs more GPUs than the whole cluster has is still settled at once as infeasible."""

from __future__ import annotations

import json
import os

import pytest

from tests.reliability_tests._util import check_case, kill_marked, new_mark, query, run_tuner, tuner_env, write_study
from tests.study_tests.fakes import MemoryRecords, ScriptedExecutor, tiny_study
from tuner.lifecycle import StopReason
from tuner.study.ledger import Ledger
from tuner.study.loop import TrialLoop
from tuner.study.optuna_adapter import OptunaStudy
from tuner.study.proposer import Proposer
from tuner.study.samplers import make_sampler

NOTICE = r"--parallel {k} is more than the resources allow: {why}; running {n} trial\(s\) at a time"


@pytest.mark.slow
def test_parallel_far_above_the_cpus_on_the_local_ray_runs_what_fits(tmp_path):
    mark = new_mark()
    study = write_study(tmp_path, "wide", trials=6, backend="simulator")
    db = tmp_path / "tuner.db"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--parallel", "64", "--json"],
                      cwd=tmp_path, env=tuner_env(mark), timeout=300)
        cpus = os.cpu_count()
        check_case(r, code=0, db=db, mark=mark, message=NOTICE.format(
            k=64, why=r"the Ray cluster has \d+ CPU\(s\) and each CPU-only trial takes 1", n=r"\d+"))
        assert r.stderr.count("is more than the resources allow") == 1, "said once"
        assert json.loads(r.stdout)["trials_run"] == 6
        assert query(db, "SELECT status FROM tuner_studies") == [("finished",)]
        n = int(r.stderr.split("running ")[1].split(" trial")[0])
        assert 1 <= n <= cpus
    finally:
        kill_marked(mark)


def test_parallel_without_ray_runs_one_trial_at_a_time_and_says_so(tmp_path):
    mark = new_mark()
    study = write_study(tmp_path, "noray", trials=3, backend="simulator")
    db = tmp_path / "tuner.db"
    try:
        r = run_tuner(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--parallel", "4", "--no-ray",
                       "--json"], cwd=tmp_path, env=tuner_env(mark), timeout=120)
        check_case(r, code=0, db=db, mark=mark, message=NOTICE.format(
            k=4, why=r"without Ray \(--no-ray\) trials run one at a time in this process", n=1))
        assert r.stderr.count("is more than the resources allow") == 1
        starts = query(db, "SELECT started_at, finished_at FROM tuner_trials WHERE launched ORDER BY started_at")
        assert all(a[1] <= b[0] for a, b in zip(starts, starts[1:])), "one at a time"
    finally:
        kill_marked(mark)


class _LimitedExecutor(ScriptedExecutor):
    """The scripted executor with a resource limit, as RayExecutor reports one."""

    def __init__(self, limit, **kw):
        super().__init__(**kw)
        self.limit = limit

    def concurrent_trials(self, num_gpus):
        return self.limit


@pytest.mark.parametrize("parallel,limit,expected", [(8, (2, "2 CPUs"), 2), (2, (4, "4 CPUs"), 2), (3, None, 3),
                                                     (5, (0, "no CPU"), 1)])
def test_the_loop_runs_min_of_parallel_and_what_fits(parallel, limit, expected, tmp_path):
    ex = _LimitedExecutor(limit, capacity=lambda n: 30)
    study = tiny_study(tmp_path, sampler="tpe")
    optuna = OptunaStudy.in_memory(make_sampler("tpe", 0))
    notices = []
    loop = TrialLoop(study, Proposer(study, optuna, 6), Ledger(MemoryRecords(), optuna, backend_kind="simulator"), ex,
                     backend_kind="simulator", budget=6, gpus_needed=lambda request: 0, workdir=str(tmp_path), seed=0,
                     parallel=parallel, prune=False, on_event=lambda kind, data: notices.append(data["message"])
                     if kind == "notice" else None)
    assert loop.run() is StopReason.BUDGET_SPENT
    assert ex.max_in_flight == expected
    assert len(notices) == (1 if limit is not None and limit[0] < parallel else 0)


def test_a_gpu_trial_bigger_than_the_cluster_is_settled_at_once():
    """RayExecutor keeps refusing at submit what Ray would keep pending for ever."""
    from tuner.study.executor import RayExecutor

    ex = RayExecutor.__new__(RayExecutor)
    ex._actors, ex._refused, ex._idle_cpu_actors, ex._cpus = {}, [], [], 1.0
    ex._cluster = {"CPU": 2.0, "GPU": 4.0}
    ex.submit(7, "deploy", num_gpus=8)
    (result,) = ex.wait()
    assert not result.ok and result.error.failure_class == "infeasible"
    assert "needs 8 GPU(s) but the Ray cluster has 4 in all" in result.error.reason
    assert ex.concurrent_trials(8) is None and ex.concurrent_trials(0) == (2, "the Ray cluster has 2 CPU(s) and each "
                                                                            "CPU-only trial takes 1")
    ex._cluster = {"CPU": 0.0}
    ex.submit(8, "deploy", num_gpus=0)
    (result,) = ex.wait()
    assert result.error.failure_class == "infeasible" and "needs 1 CPU but the Ray cluster has 0" in result.error.reason
