"""Trace files as users really have them: saved with a byte-order mark, in UTF-16, with a column
missing, renamed or doubled, or with a header and nothing else. `tuner workload stats` and `tuner
workload fit` read what can be read and otherwise exit 2 with a message naming the file, the line,
the column and the columns the format expects; no output file is written."""

from __future__ import annotations

import codecs

import pytest

from tests.conftest import REPO
from tests.reliability_tests._util import tuner_run

WEKA = (REPO / "tests/workload_tests/data/claude_code_requests_excerpt.csv").read_text()
AZURE = (REPO / "tests/workload_tests/data/azure_code_head.csv").read_text()
JSONL = (REPO / "tests/workload_tests/data/sessions_small.jsonl").read_text()
WEKA_REQUIRED = ("trace", "agent", "turn", "input_tokens", "output_tokens")


def _drop_column(text: str, column: str) -> str:
    rows = [line.split(",") for line in text.splitlines()]
    i = rows[0].index(column)
    return "\n".join(",".join(r[:i] + r[i + 1:]) for r in rows) + "\n"


@pytest.mark.parametrize("name, text, fmt, requests", [
    ("weka-bom.csv", WEKA, "weka-csv", 756),
    ("azure-bom.csv", AZURE, "azure", None),
    ("sessions-bom.jsonl", JSONL, "jsonl", None),
])
def test_a_utf8_byte_order_mark_is_skipped(tmp_path, name, text, fmt, requests):
    path = tmp_path / name
    path.write_bytes(codecs.BOM_UTF8 + text.encode())
    plain = tmp_path / ("plain-" + name)
    plain.write_text(text)
    code, out, err = tuner_run(["workload", "stats", str(path), "--json"], tmp_path)
    assert code == 0, err
    _, plain_out, _ = tuner_run(["workload", "stats", str(plain), "--json"], tmp_path)
    import json

    got, want = json.loads(out), json.loads(plain_out)
    assert got["format"] == fmt and got["requests"] == want["requests"] and got["sessions"] == want["sessions"]
    if requests:
        assert got["requests"] == requests


@pytest.mark.parametrize("codec, label", [("utf-16", "UTF-16 (little-endian)"), ("utf-16-be", None),
                                          ("utf-32", "UTF-32 (little-endian)")])
def test_utf16_and_utf32_are_named(tmp_path, codec, label):
    path = tmp_path / "trace.csv"
    data = WEKA.encode(codec)
    if codec == "utf-16-be":
        data, label = codecs.BOM_UTF16_BE + data, "UTF-16 (big-endian)"
    path.write_bytes(data)
    code, _, err = tuner_run(["workload", "stats", str(path)], tmp_path)
    assert code == 2 and f"{path}: line 1: the file is {label} text" in err and "must be UTF-8" in err, err


@pytest.mark.parametrize("column", WEKA_REQUIRED)
@pytest.mark.parametrize("command", ["stats", "fit"])
def test_a_missing_weka_column_is_named_with_the_expected_ones(tmp_path, column, command):
    path = tmp_path / "requests.csv"
    path.write_text(_drop_column(WEKA, column))
    out = tmp_path / "fitted.yaml"
    args = ["workload", command, str(path)] + (["-o", str(out)] if command == "fit" else [])
    code, _, err = tuner_run(args, tmp_path)
    assert code == 2, err
    assert f"{path}: line 1 (the header): missing column(s) '{column}'" in err, err
    assert "a weka-csv trace needs the columns trace, agent, turn, input_tokens, output_tokens" in err
    assert "found: " in err and column not in err.split("found: ")[1].split(", ")
    assert not out.exists()


def test_a_missing_azure_column_is_named(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(_drop_column(AZURE, "GeneratedTokens"))
    code, _, err = tuner_run(["workload", "stats", str(path)], tmp_path)
    assert code == 2 and "missing column(s) 'GeneratedTokens'" in err and "TIMESTAMP, ContextTokens" in err, err


def test_a_doubled_column_is_named(tmp_path):
    lines = WEKA.splitlines()
    path = tmp_path / "requests.csv"
    path.write_text("\n".join([lines[0] + ",turn"] + [ln + ",0" for ln in lines[1:]]) + "\n")
    code, _, err = tuner_run(["workload", "stats", str(path)], tmp_path)
    assert code == 2 and "line 1 (the header): column(s) 'turn' appear more than once" in err, err


def test_column_names_match_in_any_case(tmp_path):
    lines = WEKA.splitlines()
    path = tmp_path / "requests.csv"
    path.write_text("\n".join([lines[0].upper()] + lines[1:]) + "\n")
    code, out, err = tuner_run(["workload", "stats", str(path), "--format", "weka-csv"], tmp_path)
    assert code == 0, err


def test_an_unrelated_csv_lists_both_formats(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("when,who,what\n1,2,3\n")
    code, _, err = tuner_run(["workload", "stats", str(path)], tmp_path)
    assert code == 2 and "line 1: unrecognised CSV header" in err
    assert "azure (TIMESTAMP, ContextTokens, GeneratedTokens)" in err and "weka-csv (trace, agent, turn" in err


def test_a_header_without_rows(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text(WEKA.splitlines()[0] + "\n")
    code, _, err = tuner_run(["workload", "stats", str(path)], tmp_path)
    assert code == 2 and f"{path}: no requests found in weka-csv trace" in err, err


def test_a_bad_row_names_its_line_and_column(tmp_path):
    lines = WEKA.splitlines()
    bad = lines[5].split(",")
    bad[4] = "lots"
    path = tmp_path / "requests.csv"
    path.write_text("\n".join(lines[:5] + [",".join(bad)] + lines[6:]) + "\n")
    code, _, err = tuner_run(["workload", "stats", str(path)], tmp_path)
    assert code == 2 and "line 6: 'input_tokens' is not a number: 'lots'" in err, err


def test_absurd_values_give_a_clear_error_when_fitted(tmp_path):
    lines = WEKA.splitlines()
    row = lines[3].split(",")
    row[4] = "99999999999999"  # input tokens of one turn: 10^14
    path = tmp_path / "absurd.csv"
    path.write_text("\n".join(lines[:3] + [",".join(row)] + lines[4:]) + "\n")
    out = tmp_path / "fitted.yaml"
    code, _, err = tuner_run(["workload", "fit", str(path), "-o", str(out)], tmp_path)
    assert code == 2 and f"{path}: the fitted" in err and "outside what a workload profile may hold" in err, err
    assert not out.exists()
