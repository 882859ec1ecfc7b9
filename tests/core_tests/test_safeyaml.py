"""tuner.safeyaml: what it accepts is exactly PyYAML's reading; what it refuses names the place."""

from __future__ import annotations

import codecs

import pytest
import yaml

from tuner import safeyaml
from tuner.errors import ConfigError


def test_anchors_aliases_and_merge_keys_within_the_limits_work():
    text = ("base: &b {tp: 8, dp: 1}\n"
            "a:\n  <<: *b\n  dp: 2\n"  # an explicit key overrides a merged one: not a duplicate
            "list: [*b, *b]\n")
    assert safeyaml.loads(text) == yaml.safe_load(text)
    assert safeyaml.loads(text)["a"] == {"tp": 8, "dp": 2}


def test_duplicate_key_inside_a_list_is_named_with_its_path_and_lines():
    text = "params:\n  items:\n    - {a: 1}\n    - b: 1\n      c: 2\n      b: 3\n"
    with pytest.raises(ConfigError) as info:
        safeyaml.loads(text, file="f.yaml")
    assert info.value.key == "params.items[1].b" and "lines 4 and 6" in str(info.value)
    assert str(info.value).startswith("f.yaml: params.items[1].b: duplicate key 'b'")


def test_keys_equal_as_values_are_duplicates():
    with pytest.raises(ConfigError, match="duplicate key"):
        safeyaml.loads("1: a\n0x1: b\n")


@pytest.mark.parametrize("text, fragment", [
    ("a: " + "[" * 33 + "]" * 33, "nests more than 32"),
    ("a: &x [1]\nb: [" + ", ".join(["*x"] * 65) + "]", "more than 64 aliases"),
    ("a: &x {b: *x}", "contains it"),
    ("a: *x", "names no anchor"),
    ("a: 1" + "0" * 200, "a number of 201 characters"),
    ("a: [1, 2", "malformed YAML"),
])
def test_limits(text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        safeyaml.loads(text, file="f.yaml")


def test_the_node_count_includes_what_aliases_stand_for():
    ok = "a: &a [" + ", ".join(["x"] * 1000) + "]\nb: [" + ", ".join(["*a"] * 50) + "]\n"  # ~51k nodes
    assert len(safeyaml.loads(ok)["b"]) == 50
    with pytest.raises(ConfigError, match="expands to more than 100,000"):
        safeyaml.loads("a: &a [" + ", ".join(["x"] * 2000) + "]\nb: [" + ", ".join(["*a"] * 60) + "]\n")


def test_read_text_drops_a_bom_and_refuses_other_encodings(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_bytes(codecs.BOM_UTF8 + b"a: 1\n")
    assert safeyaml.load_file(p) == {"a": 1}
    p.write_bytes("a: 1\n".encode("utf-16"))
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        safeyaml.load_file(p)
