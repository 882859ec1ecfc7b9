"""The dashboard and the static report in a real headless Chromium: pages load, charts draw,
the trials table lists the trials, updates arrive live, database text stays text."""

import threading
from pathlib import Path

import pytest

from tests.report_tests.conftest import ServerThread
from tests.report_tests.fake_backend import HOSTILE_REASON

ARTIFACTS = Path(__file__).parent / "artifacts"
CHART_IDS = ("chart-history", "chart-compare", "chart-ttft", "chart-tpot", "chart-importance", "chart-parallel")


def _page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: None if r.url.startswith(("http://127.0.0.1", "file://", "data:")) else problems.append(f"external request {r.url}"))
    return page, problems


def _assert_charts_drawn(page):
    for cid in CHART_IDS:
        marks = page.locator(f"#{cid} svg :is(path, circle, rect)").count()
        assert marks >= 2, f"{cid} drew {marks} marks"
        assert page.locator(f"#{cid} .chart-empty").count() == 0, f"{cid} is empty"
    # the SLO lines are drawn on both latency charts
    assert page.locator("#chart-ttft .ref").count() == 1 and page.locator("#chart-tpot .ref").count() == 1
    assert page.locator("#chart-ttft .axis-label").all_text_contents() == ["concurrent users", "P90 TTFT (s)"]


def _assert_hostile_text_is_text(page):
    assert page.evaluate("window.__pwned") is None, "markup from the database ran"
    assert page.locator("td.failure .reason", has_text="<script>window.__pwned=1</script>").count() == 1
    assert page.locator(".summary .reason", has_text=HOSTILE_REASON[:40]).count() == 1
    assert page.locator("td.failure b, .summary b:text('bold')").count() == 0


def test_dashboard_in_chromium(browser, dashboard, finished):
    page, problems = _page(browser)
    page.goto(dashboard.url + "/")
    page.wait_for_selector("#trials-table tbody tr")
    page.wait_for_selector("#chart-importance svg rect.bar")
    from tuner.report import data

    _, storage, runs = finished
    n_trials = len(data.study(storage, "rep", runs)["trials"])
    assert page.locator("#trials-table tbody tr").count() == n_trials
    assert page.locator("#studies tbody tr").count() == 1
    _assert_charts_drawn(page)
    _assert_hostile_text_is_text(page)
    # sorting by capacity puts the best trial first; filtering narrows the rows
    page.click("#trials-table th[data-key=capacity_users]")
    assert "best" in page.locator("#trials-table tbody tr").first.inner_text()
    page.fill("input.filter", "oom")
    assert page.locator("#trials-table tbody tr").count() == 1
    page.fill("input.filter", "")
    # the log link opens the log as plain text
    href = page.locator("tr[data-trial='2'] a.log-link").get_attribute("href")
    log_page = browser.new_page()
    log_page.goto(dashboard.url + "/" + href)
    assert "CUDA out of memory <script>x</script>" in log_page.inner_text("body")
    log_page.close()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert not problems, problems
    page.close()


def test_dashboard_updates_live_while_a_study_runs(browser, tmp_path):
    from tests.report_tests.studydb import make_runner
    from tuner.report.dashboard import make_app

    storage = f"sqlite:///{tmp_path}/tuner.db"
    runner = make_runner(tmp_path, storage, name="live", trials=6)
    runner.create()
    runner.run(2)
    with ServerThread(make_app(storage, tmp_path / "runs")) as srv:
        page, problems = _page(browser)
        page.goto(srv.url + "/#study=live")
        page.wait_for_selector("#trials-table tbody tr")
        before = page.locator("#trials-table tbody tr").count()
        assert before == 2
        # the study goes on (a second driver, as `tuner study resume` does) while the page is open
        more = threading.Thread(target=make_runner(tmp_path, storage, name="live", trials=6).run, args=(6,))
        more.start()
        rows = page.locator("#trials-table tbody tr")
        for _ in range(60):  # the page polls every 3 s (wait_for_function would need eval, which the CSP forbids)
            if rows.count() >= 6:
                break
            page.wait_for_timeout(250)
        more.join(60)
        assert rows.count() >= 6
        assert page.url.endswith("#study=live")  # no reload happened
        assert page.locator("#chart-history svg circle.pt").count() >= 6
        assert not problems, problems
        page.close()


def test_static_report_in_chromium(browser, finished, tmp_path):
    from click.testing import CliRunner

    from tuner.cli.study_report import report

    _, storage, runs = finished
    out = tmp_path / "report.html"
    r = CliRunner().invoke(report, ["rep", "-o", str(out), "--storage", storage, "--runs-dir", str(runs)])
    assert r.exit_code == 0, r.output
    page, problems = _page(browser)
    page.goto(out.as_uri())
    page.wait_for_selector("#trials-table tbody tr")
    _assert_charts_drawn(page)
    _assert_hostile_text_is_text(page)
    assert page.locator("a.log-link").count() == 0  # nothing to serve logs in a file
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    assert not problems, problems
    page.close()
