"""The "why" parts of the dashboard and the report, and the `tuner compare` report, in a real
headless Chromium: the bottleneck card draws, a trial opens to every cause at its bounding load
point, database text stays text, and the comparison's table and charts draw."""

import json

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.report_tests.conftest import ServerThread
from tests.report_tests.fake_backend import HOSTILE_REASON
from tests.report_tests.test_browser import ARTIFACTS, _page
from tuner.explain import Cause


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A 4-trial simulated GLM-5.1 study with short windows: (tmp, storage)."""
    tmp = tmp_path_factory.mktemp("whysim")
    data = yaml.safe_load((REPO / "studies/h200.yaml").read_text())
    data.update(name="whysim", trials=4, seed=1, measurement={"warmup_s": 30, "duration_s": 120})
    spec = tmp / "whysim.yaml"
    spec.write_text(yaml.safe_dump(data))
    storage = f"sqlite:///{tmp}/s.db"
    r = run_cli(["study", "start", str(spec), "--backend", "simulator", "--no-ray", "--storage", storage, "--json"],
                cwd=tmp)
    assert r.returncode == 0, r.stderr
    return tmp, storage


def _open_first_trial(page):
    page.locator("#why-table tr.why-row").first.click()
    page.wait_for_selector("#why-table tr.why-detail-row")


def test_dashboard_why_card(browser, dashboard, finished):
    from tuner.report import data

    _, storage, runs = finished
    s = data.study(storage, "rep", runs)
    page, problems = _page(browser)
    page.goto(dashboard.url + "/")
    page.wait_for_selector("#why-table tbody tr.why-row")
    rows = page.locator("#why-table tbody tr.why-row")
    assert rows.count() == sum(1 for t in s["trials"] if t["bottleneck"])
    # the summary says what bounds the best trial, with its figure
    best = s["best"]
    line = page.locator(".why-summary .why-line").first.inner_text()
    assert line.startswith(f"best (trial {best['number']})") and best["bottleneck"]["sentence"] in line
    # the failed trial's sentence carries the hostile failure reason as text
    assert page.locator("#why-table td.why-sentence", has_text="<script>window.__pwned=1</script>").count() == 1
    assert page.evaluate("window.__pwned") is None
    assert HOSTILE_REASON[:20] in page.locator("#why-table tr[data-trial='2'] td.why-sentence").inner_text()
    page.locator("#chart-why svg rect.bar").first.wait_for()
    assert not problems, problems
    page.close()


def test_report_why_card_opens_a_trial_to_every_cause(browser, simulated, tmp_path):
    tmp, storage = simulated
    out = tmp_path / "why-report.html"
    r = run_cli(["study", "report", "whysim", "-o", str(out), "--storage", storage, "--runs-dir", str(tmp / "runs")],
                cwd=tmp)
    assert r.returncode == 0, r.stderr
    status = json.loads(run_cli(["study", "status", "whysim", "--storage", storage, "--json"], cwd=tmp).stdout)
    page, problems = _page(browser)
    page.goto(out.as_uri())
    page.wait_for_selector("#why-table tbody tr.why-row")
    # the baseline of a GLM-5.1 TP8 H200 study is bound by its KV pool, and the card says so
    base = next(t for t in status["trials"] if t["is_baseline"])
    assert base["bottleneck"]["binding"] == Cause.KV_CAPACITY
    base_row = page.locator(f"#why-table tr.why-row[data-trial='{base['number']}']")
    assert base_row.locator(".why-cause").inner_text() == "KV capacity"
    assert "re-compute evicted context" in base_row.locator("td.why-sentence").inner_text()
    base_row.click()
    detail = page.locator(f"#why-table tr.why-detail-row[data-trial='{base['number']}']")
    detail.wait_for()
    assert detail.locator("tr.why-finding").count() == len(Cause)
    assert detail.locator("tr.why-finding.binding").get_attribute("data-cause") == "kv_capacity"
    assert detail.locator(".why-cov.cov-simulated").count() >= 5
    assert detail.locator(".why-points li").count() == len(base["measurements"])
    # clicking again closes it
    base_row.click()
    assert page.locator("#why-table tr.why-detail-row").count() == 0
    assert page.locator(".why-summary").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#why-view").screenshot(path=str(ARTIFACTS / "why.png"))
    assert not problems, problems
    page.close()


def test_compare_report_draws_its_table_and_charts(browser, simulated, tmp_path):
    tmp, storage = simulated
    comparison = tmp_path / "compare-two.yaml"
    comparison.write_text(yaml.safe_dump({
        "name": "compare-two", "studies": ["glm-5.1-h200-nvfp4", "glm-5.1-b200-nvfp4"],
        "gpu_hour_cost": {"h200": 3.5, "b200": 6.0},
        "overrides": {"study_suffix": "-br", "trials": 2, "measurement": {"warmup_s": 30, "duration_s": 90}}}))
    out = tmp_path / "compare.html"
    r = run_cli(["compare", str(comparison), "--cross-seed", "--no-ray", "--storage", storage, "-o", str(out)], cwd=tmp)
    assert r.returncode == 0, r.stderr
    doc = json.loads(run_cli(["compare", str(comparison), "--json", "--storage", storage], cwd=tmp).stdout)
    page, problems = _page(browser)
    page.goto(out.as_uri())
    page.wait_for_selector("#compare-table tbody tr.compare-study")
    assert page.locator("#compare-table tbody tr.compare-study").count() == 2
    assert page.locator("#compare-table tbody tr.compare-config").count() == 2
    assert page.locator("#compare-kv-room tbody tr").count() == 2
    # each best configuration as the other study ran it: one row per source, a cell per study
    same = doc["same_configuration"]
    assert same and page.locator("#compare-same tbody tr").count() == len(same)
    for r in same:
        for c in r["in"]:
            cell = page.locator(f"#compare-same tr[data-source='{r['source']}'] td[data-study='{c['study']}']")
            shown = ("≥ " if c["at_search_limit"] else "") + str(c["capacity_users"])
            assert cell.locator("b").first.inner_text() == shown if c["trial"] is not None \
                else cell.inner_text() == "–"
    assert page.locator("#chart-compare-bars svg rect.bar").count() >= 6  # 2 studies x (3 groups + cost)
    assert page.locator("#chart-capacity-slo svg circle.pt").count() >= 10
    for i in range(2):
        assert page.locator(f"#chart-slo-{i} svg path").count() >= 3  # three target modes
    assert page.locator("#compare-table .why-cause").count() == 2
    assert page.locator("#chart-capacity-slo .axis-label").all_text_contents() == [
        "SLO targets (x the study's)", "capacity (users)"]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    assert not problems, problems
    page.close()
