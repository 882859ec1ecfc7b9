import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session", autouse=True)
def _kernel_caches_of_the_tests(tmp_path_factory):
    """Servers the tests start (fake SGLang servers under the live evaluator, Ray workers, CLI
    subprocesses) pin their Triton cache under ``TRITON_HOME`` and record a kernel ledger there, and
    read SGLang's JIT-module cache: both go to a directory of this run, never the user's home."""
    home = tmp_path_factory.mktemp("kernel-caches")
    saved = {k: os.environ.get(k) for k in ("TRITON_HOME", "TVM_FFI_CACHE_DIR")}
    os.environ["TRITON_HOME"] = str(home)
    os.environ["TVM_FFI_CACHE_DIR"] = str(home / "tvm-ffi")
    yield home
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def shared_traces() -> Path:
    path = SHARED / "traces"
    if not path.is_dir():
        pytest.skip("shared traces are not present beside the repository")
    return path


def run_cli(args, cwd=None, env=None, timeout=600):
    """Run `python -m tuner ...` as a real process; returns CompletedProcess."""
    import subprocess

    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# ---- the adversarial corpus: cases tried and passed per category, printed after a run ----------
CORPUS_CATEGORIES = {
    "reliability_tests/test_bad_inputs.py": "bad input files",
    "reliability_tests/test_schema_properties.py": "schema properties",
    "reliability_tests/test_hostile_files.py": "hostile files",
    "reliability_tests/test_trace_inputs.py": "traces",
    "reliability_tests/test_paths.py": "run-directory paths",
    "reliability_tests/test_safe_writes.py": "safe writes",
    "reliability_tests/test_security.py": "security",
    "reliability_tests/test_dashboard_hostile.py": "dashboard",
    "reliability_tests/test_faults.py": "server faults",
    "reliability_tests/test_crash_resume.py": "kill -9",
    "reliability_tests/test_kill9_moments.py": "kill -9",
    "reliability_tests/test_signals.py": "signals",
    "reliability_tests/test_two_drivers.py": "races (two drivers)",
    "reliability_tests/test_lease.py": "driver lease",
    "reliability_tests/test_storage_faults.py": "storage faults",
    "reliability_tests/test_parallel.py": "parallelism",
    "reliability_tests/test_stored_spec.py": "stored studies",
    "reliability_tests/test_ray_cluster.py": "Ray cluster",
    "core_tests/test_limits.py": "bounds",
    "core_tests/test_safeyaml.py": "bounded YAML",
}
_corpus: dict[str, dict[str, str]] = {}  # category -> test id -> outcome


def _category(nodeid: str) -> str | None:
    path = nodeid.split("::", 1)[0]
    return next((c for p, c in CORPUS_CATEGORIES.items() if path.endswith(p)), None)


def pytest_runtest_logreport(report):
    category = _category(report.nodeid)
    if category is None:
        return
    cases = _corpus.setdefault(category, {})
    if report.when == "call" or report.outcome != "passed":
        if cases.get(report.nodeid) in (None, "passed"):  # a failed teardown fails a passed case
            cases[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter):
    if not _corpus:
        return
    terminalreporter.section("adversarial corpus: cases per category")
    total = {"tried": 0, "passed": 0, "skipped": 0}
    for category in dict.fromkeys(CORPUS_CATEGORIES.values()):
        cases = _corpus.get(category)
        if not cases:
            continue
        outcomes = list(cases.values())
        tried = sum(o != "skipped" for o in outcomes)
        passed = outcomes.count("passed")
        skipped = outcomes.count("skipped")
        total["tried"] += tried
        total["passed"] += passed
        total["skipped"] += skipped
        terminalreporter.write_line(f"{category:<22} tried {tried:>4}  passed {passed:>4}"
                                    + (f"  skipped {skipped}" if skipped else ""))
    terminalreporter.write_line(f"{'all':<22} tried {total['tried']:>4}  passed {total['passed']:>4}"
                                + (f"  skipped {total['skipped']}" if total["skipped"] else ""))
