"""`tuner calibration fit` on the committed H200 data: choosing the trials it fits on, reporting the
load points of the trials it left out as unseen, and writing the fit to a file of its own."""

import json

import pytest
import yaml
from click.testing import CliRunner

from tests.conftest import REPO
from tuner.cli import cli
from tuner.sim.calibrate import load_calibration

RESULTS = str(REPO / "results" / "h200-sglang")


def _main(args, capsys):
    from tuner.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    return exc.value.code, capsys.readouterr().err


def test_a_trial_that_is_not_in_the_data_is_a_clear_error(capsys):
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#42"], capsys)
    assert code == 2 and "no trial 'h200-sglang-qwen3#42'" in err and "h200-sglang-qwen3#7" in err
    code, err = _main(["calibration", "fit", "--results", RESULTS, "--exclude-trials",
                       "h200-sglang-qwen3,h200-sglang-dsv3"], capsys)
    assert code == 2 and "leaves no trial" in err


def test_the_fit_uses_only_the_chosen_trials_and_reports_the_others_as_unseen(tmp_path):
    out = tmp_path / "fit.yaml"
    res = CliRunner().invoke(cli, ["calibration", "fit", "--results", RESULTS, "--only-trials", "h200-sglang-qwen3#1",
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["trials"] == ["h200-sglang-qwen3#1"]
    assert {"h200-sglang-qwen3#0", "h200-sglang-dsv3#2", "h200-sglang-qwen3#9"} <= set(doc["left_out"])
    # the check predicts every load point; those of the trials left out are summarised apart
    points = doc["fidelity"]["points"]
    unseen = doc["unseen"]
    assert unseen["load_points"] == len(points) - 3  # trial 1 measured 3 load points
    assert "h200-sglang-qwen3#1" not in unseen["trials"]
    assert set(unseen["mape"]) >= {"p90_ttft_s", "p90_tpot_s"} and unseen["verdict_agreement"] is not None
    # bf16 weights only: the fp8 call cost is not seen, and not written
    fitted = {p["name"]: p for p in doc["parameters"]}
    assert not fitted["overhead.fp8_block_gemm_s"]["fitted_from_data"]
    # the file of its own: the values, the stalls measured, and where they came from
    text = out.read_text()
    assert text.startswith("# tuner calibration fit --results") and "--only-trials h200-sglang-qwen3#1" in text
    values = yaml.safe_load(text)
    assert values["fresh_server_stalls"] == doc["calibration"]["fresh_server_stalls"]
    assert "fp8_block_gemm_s" not in values["overhead"]
    cal = load_calibration("h200", out)
    assert cal["overhead"]["cpu_step_s"] == values["overhead"]["cpu_step_s"]
