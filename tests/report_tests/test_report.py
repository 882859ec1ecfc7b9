"""`tuner study report`: one self-contained HTML file, PNG charts."""

import json
import re

import pytest

from tests.conftest import run_cli
from tests.report_tests.fake_backend import HOSTILE_REASON

# Any URL a browser could fetch. The SVG namespace string is an identifier, never fetched.
EXTERNAL_URL = re.compile(r"(?:https?:)?//(?!www\.w3\.org/2000/svg)[\w.-]+\.[a-z]{2,}|\bsrc\s*=|\bhref\s*=\s*[\"'](?!#)|@import|\burl\(",
                          re.IGNORECASE)


def _report(finished, out, *extra):
    # in-process: the fake backend is registered here, and report only reads the database
    from click.testing import CliRunner

    from tuner.cli.study_report import report

    tmp, storage, runs = finished
    return CliRunner().invoke(report, ["rep", "-o", str(out), "--storage", storage, "--runs-dir", str(runs), *extra],
                              catch_exceptions=False)


@pytest.fixture(scope="module")
def report_html(finished, tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "report.html"
    r = _report(finished, out)
    assert r.exit_code == 0, r.output
    return out


def test_report_is_self_contained(report_html):
    html = report_html.read_text()
    found = EXTERNAL_URL.findall(html)
    assert not found, f"external references: {found[:5]}"
    assert "default-src 'none'" in html  # the page itself refuses any network access


def test_report_summary_reads_for_a_person(report_html, finished):
    from tuner.report import data

    _, storage, runs = finished
    s = data.study(storage, "rep", runs)
    html = report_html.read_text()
    best, base = s["best"], s["baseline"]
    assert f"{best['capacity_users']} users</span> with trial {best['number']}" in html
    assert f"{best['capacity_users'] / base['capacity_users']:.2f}×</b> the baseline's {base['capacity_users']} users" in html
    assert "What the study tried" in html and "<code>attn-dp-size</code>" in html
    assert re.search(r'<span class="fclass">oom</span> × 1 <span class="muted">\(#2\)', html)
    assert re.search(r'<span class="fclass">infeasible</span>', html)


def test_report_escapes_database_text(report_html):
    html = report_html.read_text()
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert HOSTILE_REASON not in html  # neither raw in the summary nor in the embedded JSON
    payload = re.search(r'<script type="application/json" id="study-data">(.*?)</script>', html, re.S).group(1)
    assert "<" not in payload
    assert json.loads(payload)["study"]["trials"][2]["failure_reason"] == HOSTILE_REASON


def test_report_of_unknown_study_exits_2(finished, tmp_path):
    _, storage, _ = finished
    r = run_cli(["study", "report", "nope", "-o", str(tmp_path / "r.html"), "--storage", storage])
    assert r.returncode == 2 and "no study 'nope'" in r.stderr and "rep" in r.stderr
    assert not (tmp_path / "r.html").exists()


def test_png_charts(finished, tmp_path):
    from tuner.report.png import CHARTS, FULL_PAGE

    try:
        from tuner.report.png import find_chromium

        find_chromium()
    except Exception as exc:  # noqa: BLE001 - the reason is shown in the skip
        pytest.skip(str(exc))
    r = _report(finished, tmp_path / "r.html", "--png", str(tmp_path / "png"))
    assert r.exit_code == 0, r.output
    for name in [*CHARTS.values(), FULL_PAGE]:
        data = (tmp_path / "png" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name


def test_png_without_chromium_is_a_clear_error(monkeypatch):
    from tuner.errors import UserError
    from tuner.report import png

    monkeypatch.delenv("TUNER_CHROMIUM", raising=False)
    monkeypatch.setattr(png.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="apt-get install chromium"):
        png.find_chromium()


@pytest.mark.slow
def test_report_of_a_real_simulated_study(tmp_path):
    """The whole path a user takes: `tuner study start` on the simulator, then `tuner study report`."""
    import importlib.util

    if importlib.util.find_spec("tuner.evaluation.sim") is None:
        pytest.skip("the simulator backend is not in this build")
    storage = f"sqlite:///{tmp_path}/t.db"
    r = run_cli(["study", "start", "h200", "--trials", "2", "--storage", storage, "--no-ray", "--backend", "simulator"],
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run_cli(["study", "report", "h200", "-o", str(tmp_path / "r.html"), "--storage", storage], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    html = (tmp_path / "r.html").read_text()
    assert "GLM-5.1" in html and "simulator" in html and 'class="big"' in html
    assert not EXTERNAL_URL.findall(html)
