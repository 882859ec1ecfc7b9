from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.workload.profiles import BUILTIN_DIR, REPO_WORKLOADS_DIR, builtin_profiles, load_profile


def test_builtin_profiles_load_and_match_repo_copies():
    assert {"coding-agent", "claude-code"} <= set(builtin_profiles())
    for name in ("coding-agent", "claude-code"):
        assert load_profile(BUILTIN_DIR / f"{name}.yaml") == load_profile(REPO_WORKLOADS_DIR / f"{name}.yaml")
    cc = load_profile("claude-code")
    assert cc.new_tokens_per_turn.sigma > 0 and cc.system_prefix_tokens == 15000


def test_search_dirs_take_precedence(tmp_path):
    (tmp_path / "coding-agent.yaml").write_text(
        (REPO_WORKLOADS_DIR / "coding-agent.yaml").read_text().replace("system_prefix_tokens: 4000", "system_prefix_tokens: 7"))
    assert load_profile("coding-agent", search_dirs=[tmp_path]).system_prefix_tokens == 7


def test_unknown_profile_lists_available():
    with pytest.raises(ConfigError, match="coding-agent"):
        load_profile("no-such-profile")


@pytest.mark.parametrize("text, key", [
    ("output_tokens_per_turn: {mu: 5, sigma: -1}", "output_tokens_per_turn.sigma"),
    ("scale: 0", "scale"),
    ("bogus_key: 3", "bogus_key"),
])
def test_invalid_profile_names_file_and_key(tmp_path, text, key):
    base = (REPO_WORKLOADS_DIR / "coding-agent.yaml").read_text()
    lines = [ln for ln in base.splitlines() if not ln.startswith(text.split(":")[0] + ":")]
    p = tmp_path / "bad.yaml"
    p.write_text("\n".join(lines + [text]) + "\n")
    with pytest.raises(ConfigError) as err:
        load_profile(p)
    assert str(p) in str(err.value) and key in str(err.value)
    assert err.value.exit_code == 2


def test_missing_field_and_bad_yaml(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: x\n")
    with pytest.raises(ConfigError, match="first_turn_context_tokens"):
        load_profile(p)
    p.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="line"):
        load_profile(p)
