"""The dashboard's HTTP surface: JSON endpoints, read-only, escaping, binding."""

import hashlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.report_tests.test_report import EXTERNAL_URL

from tests.conftest import REPO
from tests.report_tests.conftest import ServerThread, http
from tests.report_tests.fake_backend import HOSTILE_REASON


def test_studies_endpoint_lists_backend_trials_best_and_baseline(dashboard, finished):
    status, headers, body = http("GET", dashboard.url + "/api/studies")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    (row,) = json.loads(body)["studies"]
    assert row["name"] == "rep" and row["backend_kind"] == "reportfake"
    assert row["trials_launched"] == 12 and row["baseline_capacity_users"] == 16
    assert row["best_capacity_users"] > row["baseline_capacity_users"]


def test_study_endpoint_has_trials_measurements_and_no_secrets(dashboard):
    status, headers, body = http("GET", dashboard.url + "/api/studies/rep")
    assert status == 200
    s = json.loads(body)
    assert s["storage"] is None and all("pids" not in t for t in s["trials"])
    t0 = s["trials"][0]
    assert t0["is_baseline"] and t0["measurements"][0]["users"] == 8
    assert {m["users"] for m in t0["measurements"]} >= {t0["capacity_users"]}
    failed = next(t for t in s["trials"] if t["number"] == 2)
    assert failed["failure_class"] == "oom" and failed["log_available"]
    # an unchanged study answers 304 to the page's If-None-Match
    status, _, _ = http("GET", dashboard.url + "/api/studies/rep", {"If-None-Match": headers["ETag"]})
    assert status == 304


def test_summary_html_escapes_database_text(dashboard):
    _, _, body = http("GET", dashboard.url + "/api/studies/rep")
    summary = json.loads(body)["summary_html"]
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in summary
    assert "<script" not in summary and "<b>bold" not in summary


def test_importance_endpoint(dashboard):
    status, _, body = http("GET", dashboard.url + "/api/studies/rep/importance")
    imp = json.loads(body)
    assert status == 200 and imp["importances"] and imp["trials"] >= 12


@pytest.mark.parametrize("path", ["/", "/api/studies", "/api/studies/rep", "/static/app.js", "/nowhere",
                                  "/api/studies/rep/trials/2/log"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_get_is_served(dashboard, path, method):
    status, headers, _ = http(method, dashboard.url + path)
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_unknown_things_are_404(dashboard):
    assert http("GET", dashboard.url + "/api/studies/nope")[0] == 404
    assert http("GET", dashboard.url + "/static/data.py")[0] == 404
    assert http("GET", dashboard.url + "/static/..%2fdata.py")[0] == 404
    assert http("GET", dashboard.url + "/api/studies/rep/trials/0x1/log")[0] == 404
    status, _, body = http("GET", dashboard.url + "/api/studies/rep/trials/999/log")
    assert status == 404 and b"no trial 999" in body


def test_log_is_plain_text_sandboxed(dashboard):
    status, headers, body = http("GET", dashboard.url + "/api/studies/rep/trials/2/log")
    assert status == 200 and b"CUDA out of memory" in body
    assert headers["Content-Type"].startswith("text/plain")
    assert "sandbox" in headers["Content-Security-Policy"] and headers["X-Content-Type-Options"] == "nosniff"


def test_logs_outside_the_run_directory_are_not_served(finished, tmp_path):
    from tuner.report.dashboard import make_app

    _, storage, _ = finished
    with ServerThread(make_app(storage, tmp_path)) as srv:  # a runs dir that does not hold the logs
        assert http("GET", srv.url + "/api/studies/rep/trials/2/log")[0] == 404
        _, _, body = http("GET", srv.url + "/api/studies/rep")
        assert not any(t["log_available"] for t in json.loads(body)["trials"])


def test_page_and_assets_are_local_with_a_strict_policy(dashboard):
    status, headers, body = http("GET", dashboard.url + "/")
    assert status == 200 and b'src="static/charts.js"' in body
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    for name in ("charts.js", "view.js", "app.js", "style.css"):
        status, _, asset = http("GET", f"{dashboard.url}/static/{name}")
        assert status == 200 and not EXTERNAL_URL.search(asset.decode())


def test_serving_does_not_write_the_database(finished):
    from tuner.report.dashboard import make_app

    tmp, storage, runs = finished
    db_file = tmp / "tuner.db"
    before = hashlib.sha256(db_file.read_bytes()).hexdigest()
    with ServerThread(make_app(storage, runs)) as srv:
        for path in ("/api/studies", "/api/studies/rep", "/api/studies/rep/importance", "/api/studies/rep/trials/2/log"):
            assert http("GET", srv.url + path)[0] == 200
    assert hashlib.sha256(db_file.read_bytes()).hexdigest() == before


def _listening_addresses(port: int) -> set[str]:
    addrs = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":  # LISTEN
                addrs.add(addr)
    return addrs


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_cli_binds_loopback_by_default(finished):
    tmp, storage, runs = finished
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "--storage", storage, "--port", str(port),
                             "--runs-dir", str(runs)], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.time() + 30
        while time.time() < deadline and not _listening_addresses(port):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        assert _listening_addresses(port) == {"0100007F"}, "listens on 127.0.0.1 only"
        assert http("GET", f"http://127.0.0.1:{port}/api/studies")[0] == 200
    finally:
        proc.terminate()
        proc.wait(10)
    assert f"http://127.0.0.1:{port}/" in proc.stderr.read()


def test_cli_refuses_a_missing_database(tmp_path):
    from tests.conftest import run_cli

    r = run_cli(["dashboard", "--storage", f"sqlite:///{tmp_path}/none.db"])
    assert r.returncode == 2 and "no study database" in r.stderr
