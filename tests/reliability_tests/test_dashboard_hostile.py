"""The dashboard against careless and hostile clients, run as a user runs it (`tuner dashboard
--port 0`, its own process): no storage URL or internal path in any answer, a 4xx and no traceback
for bad or oversized requests, the real port printed, files that are not databases refused at
start, and concurrent requests served from one computation."""

from __future__ import annotations

import gzip
import json
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.reliability_tests._util import digest, tuner_env, tuner_main
from tests.report_tests.conftest import ServerThread, http
from tests.report_tests.studydb import run_study


class Dashboard:
    def __init__(self, storage: str, runs_dir: Path, cwd: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "tuner", "dashboard", "--storage", storage, "--port", "0",
                                      "--runs-dir", str(runs_dir)], cwd=cwd, env=tuner_env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = self.proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", first)
        assert m, first + self.proc.stderr.read()
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=20)
        return err


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A finished 6-trial study (real driver, fake backend with server logs) whose failure reasons
    mention the database path, the storage URL and the runs directory; the dashboard over it."""
    tmp = tmp_path_factory.mktemp("dash-hostile")
    storage, _ = run_study(tmp, trials=6)
    db = tmp / "tuner.db"
    con = sqlite3.connect(db)
    con.execute("UPDATE tuner_trials SET failure_reason = ? WHERE trial_number = 2",
                (f"server died, see {tmp}/runs/rep/trial-0002/server.log (storage {storage}, file {db})",))
    con.commit()
    con.close()
    before = digest(db)
    dash = Dashboard(storage, tmp / "runs", tmp)
    yield dash, tmp, storage
    err = dash.stop()
    assert "Traceback" not in err, err
    assert digest(db) == before, "the dashboard changed the database"


def _get(url: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    status, hdrs, body = http("GET", url, headers)
    if hdrs.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return status, hdrs, body


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


PATHS = ["/", "/static/app.js", "/api/studies", "/api/studies/rep", "/api/studies/rep/importance",
         "/api/studies/nope", "/api/studies/nope/importance", "/api/studies/rep/trials/999/log",
         "/api/studies/nope/trials/1/log", "/nowhere"] + [f"/api/studies/rep/trials/{n}/log" for n in range(6)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_no_storage_url_or_internal_path_in_any_answer(served, path, encoding):
    dash, tmp, storage = served
    status, _, body = _get(dash.url + path, {"Accept-Encoding": encoding})
    assert status in (200, 404), (status, body[:300])
    text = body.decode()
    for secret in (storage, str(tmp), str(tmp.resolve()), "tuner.db"):
        assert secret not in text, f"{secret!r} in the answer to {path}: {text[:500]}"
    assert "Traceback" not in text


def test_the_redacted_reason_still_reads(served):
    dash, _, _ = served
    s = json.loads(_get(dash.url + "/api/studies/rep")[2])
    reason = next(t for t in s["trials"] if t["number"] == 2)["failure_reason"]
    assert "<runs-dir>/rep/trial-0002/server.log" in reason and "the study database" in reason
    assert all("log_path" not in t and "pids" not in t for t in s["trials"])
    assert "storage" not in json.loads(_get(dash.url + "/api/studies")[2])


BAD_REQUESTS = {
    "request line of 100 kB": b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header of 100 kB": b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
    "500 headers": b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(500)) + b"\r\n",
    "not HTTP": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,
    "garbage method": b"G\x00T / HTTP/1.1\r\n\r\n",
    "bad version": b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    "bad content length": b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_a_4xx_and_the_dashboard_goes_on(served, case):
    dash, _, _ = served
    answer = _raw(dash.port, BAD_REQUESTS[case])
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else None
    assert status is None or 400 <= status < 500, answer[:200]  # None: the connection was closed
    assert b"Traceback" not in answer
    assert _get(dash.url + "/api/studies")[0] == 200


@pytest.mark.parametrize("path", ["/api/studies/" + "x" * 300, "/api/studies/a%01b", "/api/studies/a%00b/importance",
                                  "/api/studies/rep/trials/99999999999999999999/log", "/api/studies/rep/trials/-1/log",
                                  "/api/studies/rep/trials/1e3/log", "/api/studies/rep/trials/%D9%A3/log",
                                  "/static/..%2f..%2fetc%2fpasswd", "/api/studies/..%2f..%2fetc"])
def test_unknown_or_hostile_names_are_404(served, path):
    dash, _, _ = served
    status, headers, body = _get(dash.url + path)
    assert status == 404, body[:200]
    assert headers["Content-Type"].startswith("application/json") and "error" in json.loads(body)


def test_a_large_body_is_refused_without_reading_it(served):
    """A POST announcing 100 MB is answered (405) before any of the body is sent."""
    dash, _, _ = served
    with socket.create_connection(("127.0.0.1", dash.port), timeout=10) as s:
        s.sendall(b"POST /api/studies HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n")
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 405"), answer[:200]


def test_port_zero_prints_a_port_that_serves(served):
    dash, _, _ = served
    assert dash.port > 0
    with urllib.request.urlopen(dash.url + "/", timeout=10) as r:
        assert r.status == 200


def _write_garbage(p: Path) -> None:
    p.write_bytes(bytes(range(256)) * 20)


@pytest.mark.parametrize("kind", ["garbage bytes", "text file", "a study YAML", "directory", "missing", "not sqlite URL"])
def test_a_file_that_is_not_a_database_is_refused_at_start(kind, tmp_path):
    target = tmp_path / "tuner.db"
    storage = f"sqlite:///{target}"
    if kind == "garbage bytes":
        _write_garbage(target)
    elif kind == "text file":
        target.write_text("hello, this is not SQLite\n" * 100)
    elif kind == "a study YAML":
        target.write_text("name: x\nmodel: glm-5.1\n")
    elif kind == "directory":
        target.mkdir()
    elif kind == "not sqlite URL":
        storage = "notadb://x/y"
    before = target.read_bytes() if target.is_file() else None
    t0 = time.monotonic()
    code, err = tuner_main(["dashboard", "--storage", storage, "--port", "0"], tmp_path)
    assert code == 2, err
    assert time.monotonic() - t0 < 60  # refused, not served until the test times out
    assert "Internal error" not in err and "tuner dashboard on" not in err
    assert (str(target) if kind != "not sqlite URL" else "notadb") in err, err
    if before is not None:
        assert target.read_bytes() == before


def test_concurrent_requests_share_one_computation(tmp_path):
    """50 simultaneous GETs of a study: identical answers from a single computation."""
    import concurrent.futures

    from tuner.report.dashboard import CACHE_KEY, make_app

    storage, _ = run_study(tmp_path, trials=4)
    app = make_app(storage, tmp_path / "runs")
    with ServerThread(app) as srv:
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda _: _get(srv.url + "/api/studies/rep"), range(50)))
        assert {a[0] for a in answers} == {200}
        assert len({a[2] for a in answers}) == 1
        assert app[CACHE_KEY].computations == 1
        etag = answers[0][1]["ETag"]
        assert http("GET", srv.url + "/api/studies/rep", {"If-None-Match": etag})[0] == 304


def test_an_internal_error_is_a_500_without_details(tmp_path, monkeypatch):
    from tuner.report import dashboard, data

    storage, _ = run_study(tmp_path, trials=3)

    def broken(*args, **kwargs):
        raise RuntimeError(f"boom at {tmp_path}/secret")

    monkeypatch.setattr(data, "study", broken)
    with ServerThread(dashboard.make_app(storage, tmp_path / "runs")) as srv:
        status, _, body = _get(srv.url + "/api/studies/rep")
    assert status == 500 and b"secret" not in body and b"Traceback" not in body
    assert json.loads(body) == {"error": "internal error in the dashboard (see its log)"}
