"""Choosing real trials by name (`study#N` or a whole `study`) for the fit and the fidelity check, and
how their metrics are shown."""

import pytest

from tuner.errors import ConfigError
from tuner.sim.measured import TrialSelection, format_metric, trial_label

KNOWN = {("qwen", 0), ("qwen", 3), ("dsv3", 2)}


def test_names_are_trials_or_whole_studies_and_lists_split_on_commas():
    sel = TrialSelection.parse(["qwen#0, dsv3", "qwen#3"], ["dsv3#2"])
    assert sel.only == ("qwen#0", "dsv3", "qwen#3") and sel.exclude == ("dsv3#2",)
    assert sel.keeps("qwen", 0) and sel.keeps("qwen", 3) and not sel.keeps("dsv3", 2)
    assert TrialSelection.parse(exclude=["qwen"]).keeps("dsv3", 2)
    assert not TrialSelection.parse(exclude=["qwen"]).keeps("qwen", 3)
    assert TrialSelection.parse().everything and TrialSelection.parse().keeps("anything", 9)
    assert trial_label("qwen", 3) == "qwen#3"


def test_a_name_matching_nothing_or_a_selection_leaving_nothing_is_refused():
    with pytest.raises(ConfigError, match=r"no trial 'qwen#9'.*valid: dsv3, dsv3#2, qwen, qwen#0, qwen#3"):
        TrialSelection.parse(["qwen#9"]).check(KNOWN)
    with pytest.raises(ConfigError, match="exclude-trials"):
        TrialSelection.parse(exclude=["nope"]).check(KNOWN)
    with pytest.raises(ConfigError, match="leaves no trial"):
        TrialSelection.parse(["qwen#0"], ["qwen"]).check(KNOWN)
    TrialSelection.parse(["qwen"], ["qwen#0"]).check(KNOWN)  # fine: qwen#3 is left


def test_metrics_are_shown_in_their_report_units():
    assert format_metric(0.3314, "p90_ttft_s") == "0.33"
    assert format_metric(0.02312, "p90_tpot_s") == "23.1"  # TPOT in ms
    assert format_metric(1234.4, "throughput_tokens_per_s") == "1,234"
    assert format_metric(0.876, "prefix_cache_hit_rate") == "0.88"
    assert format_metric(None, "p90_tpot_s", "–") == "–"
