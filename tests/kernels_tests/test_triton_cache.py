"""Reading Triton's cache: which kernel an entry holds and what two entries of one kernel differ in."""

from __future__ import annotations

import json

from tuner.kernels.triton_cache import entry_names, kernel_name, twin_diff


def _entry(root, name, kernel, ir, meta):
    d = root / name
    d.mkdir(parents=True)
    (d / f"{kernel}.ttir").write_text(ir)
    (d / f"{kernel}.json").write_text(json.dumps(meta))
    (d / f"__grp__{kernel}.json").write_text("{}")
    return d


IR = "module {\n  tt.func @k(%arg0: !tt.ptr<f8> {tt.divisibility = 16 : i32}, %arg1: i32 {tt.divisibility = 16 : i32})\n}\n"


def test_the_twin_of_the_same_kernel_is_found_and_the_specialisation_that_differs_is_named(tmp_path):
    _entry(tmp_path, "aaaa", "fused_moe_kernel", IR, {"num_warps": 8, "num_stages": 3})
    _entry(tmp_path, "bbbb", "other_kernel", "module {}\n", {"num_warps": 4})
    mine = IR.replace("%arg1: i32 {tt.divisibility = 16 : i32}", "%arg1: i32")
    _entry(tmp_path, "cccc", "fused_moe_kernel", mine, {"num_warps": 8, "num_stages": 3})
    assert entry_names(tmp_path) == {"aaaa", "bbbb", "cccc"}
    assert kernel_name(tmp_path / "cccc") == "fused_moe_kernel"
    out = twin_diff(tmp_path, "cccc", {"aaaa", "bbbb"})
    assert out[0].startswith("fused_moe_kernel: cccc against aaaa (1 other")
    assert any(ln.startswith("  IR -") and "divisibility" in ln for ln in out)
    assert any(ln.startswith("  IR +") and "%arg1: i32)" in ln for ln in out)
    assert "  metadata identical" in out


def test_options_that_differ_show_in_the_metadata_and_no_twin_gives_nothing(tmp_path):
    _entry(tmp_path, "aaaa", "fused_moe_kernel", IR, {"num_warps": 8, "num_stages": 3})
    _entry(tmp_path, "cccc", "fused_moe_kernel", IR, {"num_warps": 8, "num_stages": 4})
    out = twin_diff(tmp_path, "cccc", {"aaaa"})
    assert "  IR identical" in out and any("num_stages" in ln and ln.startswith("  metadata +") for ln in out)
    assert twin_diff(tmp_path, "cccc", set()) == []
    assert entry_names(tmp_path / "missing") == set()
