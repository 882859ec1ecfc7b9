"""The study of a results database, as the readers of committed measurements get it."""

import pytest
import yaml

from tests.conftest import REPO
from tuner.config.load import load_study, results_study, stored_spec_yaml
from tuner.errors import ConfigError


def test_a_stored_study_reads_back_with_its_workload():
    study = load_study(str(REPO / "studies" / "h200-sglang-qwen3.yaml"))
    again = results_study(stored_spec_yaml(study), study.name, "results/x.db")
    assert again == study and again.workload_profile().name == study.workload_profile().name


@pytest.mark.parametrize("spec_yaml", ["- not a study", yaml.safe_dump({"name": "s", "model": "qwen3-30b-a3b"})])
def test_one_this_tuner_cannot_read_names_the_study_and_the_database(spec_yaml):
    with pytest.raises(ConfigError, match="study 's': cannot read its spec") as exc:
        results_study(spec_yaml, "s", "results/h200-sglang/x.db")
    assert exc.value.file == "results/h200-sglang/x.db"
