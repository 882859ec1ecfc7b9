"""The kernel ledger of a pinned Triton cache: what it reads from server logs, what it keeps per
kernel set, damaged files, concurrent writers, and a deployment's view of it on real SGLang plans."""

from __future__ import annotations

import gzip
import json
import multiprocessing
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.backends.sglang import SGLangBackend
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.kernel_ledger import (LEDGER_FILE, LEDGER_FORMAT, KernelLedger, kernel_set_key,
                                            served_token_counts)
from tuner.evaluation.live import _LedgerView
from tuner.sim.warmup import CachedKernels

LOG_0517 = """\
[2026-12-07 05:45:19] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=8.96 GB
[2026-12-07 05:45:22] Capture target decode CUDA graph end. elapsed=3.22 s, mem usage=2.10 GB, avail mem=6.85 GB.
[2026-12-07 05:45:24] Prefill batch, #new-seq: 1, #new-token: 3, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 2.45
[2026-12-07 05:45:25] Prefill batch, #new-seq: 1, #new-token: 2048, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 183, cuda graph: False, input throughput (token/s): 1793.32
[2026-12-07 05:45:26] Decode batch, #running-req: 1, #token: 2300, token usage: 0.00, cuda graph: True, gen throughput (token/s): 60.1, #queue-req: 0
[2026-12-07 05:45:27] Prefill batch, #new-seq: 2, #new-token: 183, #cached-token: 4000, token usage: 0.00, #running-req: 1, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 40064.44
"""
LOG_OLDER = """\
[2026-11-01 10:00:00] Capture cuda graph bs [1, 2, 4, 8, 16, 24]
[2026-11-01 10:00:05] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 12], avail mem=12.6 GB
[2026-11-01 10:01:00] Prefill batch, #new-seq: 1, #new-token: 77, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0
"""


def test_served_token_counts_reads_prefill_and_capture_sizes_from_plain_and_gzipped_logs(tmp_path):
    plain = tmp_path / "sglang0.log"
    plain.write_text(LOG_0517)
    zipped = tmp_path / "sglang1.log.gz"
    with gzip.open(zipped, "wt") as f:
        f.write(LOG_OLDER)
    got = served_token_counts([plain, zipped, tmp_path / "missing.log"])
    assert got.prefill_tokens == (3, 77, 183, 2048)
    assert got.graph_tokens == (1, 2, 4, 8, 12, 16, 24)  # decode bs of both formats, prefill graph tokens
    assert served_token_counts([]) == CachedKernels()


def test_kernel_set_key_is_stable_and_tells_sets_apart():
    a = {"gpu": "NVIDIA H100", "flags": {"kv-cache-dtype": "fp8_e4m3", "tp-size": 1}}
    b = {"flags": {"tp-size": 1, "kv-cache-dtype": "fp8_e4m3"}, "gpu": "NVIDIA H100"}
    assert kernel_set_key(a) == kernel_set_key(b) and len(kernel_set_key(a)) == 16
    assert kernel_set_key(a) != kernel_set_key({**a, "flags": {"tp-size": 1}})


def test_ledger_keeps_the_union_of_what_each_set_ran_and_nothing_across_sets(tmp_path):
    ledger = KernelLedger(tmp_path / "cache")
    assert ledger.cached("a") is None  # no file yet
    ledger.record("a", {"gpu": "x"}, CachedKernels((3, 2048), (1, 2)))
    got = ledger.record("a", {"gpu": "x"}, CachedKernels((183, 2048), (4,)))
    assert got == CachedKernels((3, 183, 2048), (1, 2, 4))
    assert ledger.cached("a") == got
    assert ledger.cached("b") is None
    ledger.record("b", {"gpu": "y"}, CachedKernels((5,), ()))
    assert ledger.cached("a") == got and ledger.cached("b") == CachedKernels((5,))
    doc = json.loads((tmp_path / "cache" / LEDGER_FILE).read_text())
    assert doc["format"] == LEDGER_FORMAT and doc["sets"]["a"]["parts"] == {"gpu": "x"}
    # another reader of the same directory sees the same record
    assert KernelLedger(tmp_path / "cache").cached("a") == got


@pytest.mark.parametrize("damage", ["not json {", json.dumps({"format": "other/9", "sets": {}}), json.dumps([1, 2]),
                                    json.dumps({"format": LEDGER_FORMAT, "sets": {"a": {"prefill_tokens": ["x"]}}})])
def test_a_damaged_ledger_is_taken_as_nothing_cached_and_recording_goes_on(tmp_path, damage):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / LEDGER_FILE).write_text(damage)
    ledger = KernelLedger(cache)
    assert ledger.cached("a") is None  # never a cold cache called warm
    ledger.record("a", {}, CachedKernels((9,)))
    assert ledger.cached("a") == CachedKernels((9,))


def _record_many(cache_dir: str, key: str, start: int) -> None:
    ledger = KernelLedger(Path(cache_dir))
    for i in range(start, start + 40):
        ledger.record(key, {}, CachedKernels((i + 1,)))


def test_writers_in_several_processes_lose_no_record(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_record_many, args=(str(tmp_path), k, s)) for k, s in (("a", 0), ("a", 40), ("b", 0))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ledger = KernelLedger(tmp_path)
    assert ledger.cached("a").prefill_tokens == tuple(range(1, 81))
    assert ledger.cached("b").prefill_tokens == tuple(range(1, 41))


# ---- a deployment's view, on real SGLang launch plans ----------------------------------------------

def _plan(tmp_path, name: str, flags: dict, cache: Path, **options):
    study = SimpleNamespace(model={"name": "deepseek-v3", "overrides": {"num_hidden_layers": 5}},
                            hardware=SimpleNamespace(gpu="h100", gpus_per_node=1, nodes=1),
                            backend_options={"server_command": ["sglang", "serve"], "load_format": "dummy",
                                             "sglang_version": "0.5.17", "env": {"TRITON_CACHE_DIR": str(cache)},
                                             **options})
    req = TrialRequest(study=study, trial_number=0, flags=flags, knobs={}, workdir=str(tmp_path / name),
                       gpu_ids=(0,))
    return SGLangBackend().build_plan(req, tmp_path / name)


def test_later_servers_of_one_kernel_set_find_what_earlier_ones_ran(tmp_path):
    cache = tmp_path / "triton"
    backend = SGLangBackend()
    base = {"quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "max-running-requests": 32,
            "chunked-prefill-size": 2048}
    # the baseline names SGLang's defaults explicitly (tp-size 1, a false switch), the later trials do not
    first = _plan(tmp_path, "t0", {**base, "tp-size": 1, "enable-mixed-chunk": False, "page-size": None}, cache)
    view = _LedgerView.before_start(backend, first)
    assert view is not None and view.cached is None  # a cold cache
    Path(first.servers[0].log_path).write_text(LOG_0517)
    view.record(first)
    # batch limits and scheduling change no kernel: the same set, and what the first server ran is built
    second = _plan(tmp_path, "t1", {**base, "max-running-requests": 48, "chunked-prefill-size": 4096,
                                    "schedule-policy": "lpm"}, cache)
    found = _LedgerView.before_start(backend, second)
    assert found.key == view.key
    assert found.cached == CachedKernels((3, 183, 2048), (1, 2, 4, 8))
    assert found.describe(found.cached)["cached"] == {"prefill_tokens": [3, 183, 2048], "graph_tokens": [1, 2, 4, 8]}
    # another KV format is another kernel set: nothing of it is built yet
    other = _LedgerView.before_start(backend, _plan(tmp_path, "t2", {**base, "kv-cache-dtype": None}, cache))
    assert other.key != view.key and other.cached is None


def test_no_ledger_where_the_cache_is_not_pinned(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    plan = _plan(tmp_path, "t0", {"quantization": "fp8"}, tmp_path / "unused", env={"TRITON_CACHE_DIR": None})
    assert SGLangBackend().kernel_cache_dir(plan) is None
    assert _LedgerView.before_start(SGLangBackend(), plan) is None


def test_tile_files_name_the_kernel_set(tmp_path):
    from tuner.backends.sglang import kernel_set_parts

    tile = tmp_path / "E=256,N=256.json"
    tile.write_text('{"1": {"BLOCK_SIZE_M": 16}}')
    parts = dict(sglang_version="0.5.17", triton_version="3.6.0", device_name="NVIDIA H100 80GB HBM3",
                 model_path=str(tmp_path))
    a = kernel_set_parts({"tp-size": 1, "mem-fraction-static": 0.8}, tile_files=[str(tile)], **parts)
    assert a["flags"] == {"tp-size": 1}  # memory and scheduling flags name no kernel set
    tile.write_text('{"1": {"BLOCK_SIZE_M": 32}}')
    b = kernel_set_parts({"tp-size": 1}, tile_files=[str(tile)], **parts)
    assert kernel_set_key(a) != kernel_set_key(b)
    assert kernel_set_key(b) != kernel_set_key({**b, "triton_version": "3.5.1"})


# ---- `tuner kernels ledger` ---------------------------------------------------------------------

def test_the_ledger_command_lists_each_kernel_set_and_refuses_a_file(tmp_path):
    from click.testing import CliRunner

    from tuner.cli import cli
    from tuner.errors import ConfigError

    cache = tmp_path / "triton"
    ledger = KernelLedger(cache)
    ledger.record("a" * 16, {"gpu": "NVIDIA_H100", "sglang_version": "0.5.17", "flags": {"quantization": "fp8"}},
                  CachedKernels((3, 2048), (1, 2, 4)))
    res = CliRunner().invoke(cli, ["kernels", "ledger", "--cache-dir", str(cache), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["ledger"] == str(cache / LEDGER_FILE)
    assert doc["sets"] == [{"kernel_set": "a" * 16, "gpu": "NVIDIA_H100", "sglang_version": "0.5.17",
                            "flags": {"quantization": "fp8"}, "prefill_sizes": 2, "graph_sizes": 3,
                            "largest_prefill": 2048, "updated": doc["sets"][0]["updated"]}]
    text = CliRunner().invoke(cli, ["kernels", "ledger", "--cache-dir", str(cache)]).output
    assert "1 kernel set(s)" in text and "quantization=fp8" in text and "2 prefill sizes (up to 2,048 tokens)" in text
    empty = CliRunner().invoke(cli, ["kernels", "ledger", "--cache-dir", str(tmp_path / "none")])
    assert empty.exit_code == 0 and "no kernel ledger in" in empty.output
    wrong = CliRunner().invoke(cli, ["kernels", "ledger", "--cache-dir", str(cache / LEDGER_FILE)])
    assert isinstance(wrong.exception, ConfigError) and wrong.exception.exit_code == 2
    assert "not a directory" in str(wrong.exception) and LEDGER_FILE in str(wrong.exception)
