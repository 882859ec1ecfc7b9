"""Security: processes start from argv lists (never a shell), user-supplied SGLang arguments are
checked against the real flag set before a study starts, the dashboard binds loopback by default."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.reliability_tests._util import free_port, tuner_env, wait_until

PACKAGE = REPO / "tuner"
SHELL_CALLS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"), ("subprocess", "getstatusoutput"),
               ("asyncio", "create_subprocess_shell"), ("os", "execlp"), ("os", "spawnlp")}


def _shell_uses(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                found.append(f"{path.relative_to(root)}:{node.lineno}: shell=...")
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in SHELL_CALLS:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {f.value.id}.{f.attr}")
        if isinstance(f, ast.Name) and f.id in ("system", "popen", "create_subprocess_shell"):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {f.id}")
    return found


def test_no_shell_anywhere_in_the_package():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = [use for f in files for use in _shell_uses(f)]
    assert not found, "processes must start from argv lists, not shell strings:\n" + "\n".join(found)


def test_the_scan_finds_a_shell_call(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import os, subprocess\nsubprocess.run('ls', shell=True)\nos.system('ls')\n")
    assert len(_shell_uses(bad, root=tmp_path)) == 2


def test_server_process_refuses_a_command_string():
    from tuner.backends.process import ServerLaunch, ServerProcess

    with pytest.raises(ValueError, match="argv must be a non-empty list"):
        ServerProcess(ServerLaunch(name="x", argv="sglang serve --port 1; rm -rf /", port=1, log_path="/dev/null"))


def test_shell_metacharacters_reach_the_server_as_plain_arguments(tmp_path):
    from tuner.backends.process import ServerLaunch, ServerProcess

    evil = [f"a; touch {tmp_path}/pwned1", f"$(touch {tmp_path}/pwned2)", f"`touch {tmp_path}/pwned3`", "*"]
    spec = ServerLaunch(name="echo", argv=[sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))",
                                         *evil], port=free_port(), log_path=str(tmp_path / "echo.log"))
    server = ServerProcess(spec).start()
    server.proc.wait(timeout=30)
    server.stop(grace_s=1)
    printed = [ln for ln in (tmp_path / "echo.log").read_text().splitlines() if ln.startswith("[")]
    assert json.loads(printed[-1]) == evil
    assert not list(tmp_path.glob("pwned*"))


def _study_with(tmp_path: Path, options: dict) -> Path:
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    data.update(name="sec", trials=1, backend_options=options)
    p = tmp_path / "sec.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("args, fragment", [
    (["--tp-sise", "8"], "did you mean --tp-size"),
    (["--enable-magic"], "not SGLang 0.5.23 server flag(s): --enable-magic"),
    (["--port", "80"], "--port is set by tuner"),
    (["log-level", "info"], "is not a flag"),
    ("--log-level info", "give a list of arguments"),
])
def test_extra_sglang_arguments_are_checked_through_the_study_path(tmp_path, args, fragment):
    study = _study_with(tmp_path, {"extra_server_args": args})
    db = tmp_path / "tuner.db"
    r = run_cli(["study", "start", str(study), "--storage", f"sqlite:///{db}", "--no-ray"], cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"{study}: backend_options.extra_server_args:" in r.stderr and fragment in r.stderr, r.stderr
    assert not db.exists()


def test_valid_extra_arguments_stay_one_argv_element_each(tmp_path):
    """A value with shell syntax is accepted as a value and passed as a single argument."""
    from tuner.backends.sglang import SGLangBackend
    from tuner.evaluation.base import TrialRequest
    from tuner.config.load import load_study

    evil = f"info; touch {tmp_path}/pwned"
    study = load_study(str(_study_with(tmp_path, {"extra_server_args": ["--log-level", evil]})))
    req = TrialRequest(study=study, trial_number=0, flags={"tp-size": 8, "quantization": "modelopt_fp4"},
                       workdir=str(tmp_path))
    plan = SGLangBackend().build_plan(req, tmp_path / "trial")
    argv = plan.servers[0].argv
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    i = argv.index("--log-level")
    assert argv[i + 1] == evil


def _listen_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp and tcp6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if state == "0A" and int(p, 16) == port:
                out.add(addr)
    return out


def test_dashboard_binds_loopback_by_default(tmp_path):
    from tuner.storage import db

    url = f"sqlite:///{tmp_path}/tuner.db"
    db.ensure_schema(db.get_engine(url))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "--storage", url, "--port", str(port)],
                            cwd=tmp_path, env=tuner_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        addrs = wait_until(lambda: _listen_addresses(port) or proc.poll() is not None, timeout_s=30)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert addrs == {"0100007F"}, f"dashboard listens on {addrs}, not only 127.0.0.1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
