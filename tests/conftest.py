import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


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
