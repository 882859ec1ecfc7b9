"""Rows of SGLang's bench_one_batch from its log, for a run cut off before it wrote its result file.

bench_one_batch runs every (batch size, input length) pair in order, printing one "Prefill." and one
"Decode.  median" line for each after its "Benchmark ..." line. A prefill whose token rate is under
JIT_SHARE of the log's median rate is dropped (its prefill_latency is null): the first prefill of a
new shape compiles Triton kernels (11.6-14.6 s for 2,048 tokens of the 8-layer DeepSeek-V3, 176 token/s,
against 0.17 s for 8,192 once built, 47,700 token/s); decode steps replay CUDA graphs and are kept.

Usage: python one_batch_log_rows.py LOG --batch-size 1 4 16 64 --input-len 256 2048 --output-len 32 > rows.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import re

JIT_SHARE = 0.1


def rows(text: str, batch_sizes: list[int], input_lens: list[int], output_len: int) -> list[dict]:
    bench = text.split("Benchmark ...", 1)[-1]
    prefills = [float(x) for x in re.findall(r"^Prefill\. latency: ([0-9.]+) s", bench, re.M)]
    decodes = [float(x) for x in re.findall(r"^Decode\.  median latency: ([0-9.]+) s", bench, re.M)]
    runs = list(zip(itertools.product(batch_sizes, input_lens), prefills, decodes))
    rates = sorted(bs * n / pre for (bs, n), pre, _ in runs)
    median_rate = rates[len(rates) // 2] if rates else 0.0
    out = []
    for (bs, n), pre, dec in runs:
        compiled = bs * n / pre < JIT_SHARE * median_rate
        out.append({"run_name": "log", "batch_size": bs, "input_len": n, "output_len": output_len,
                    "prefill_latency": None if compiled else pre, "median_decode_latency": dec,
                    "prefill_latency_logged": pre})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--batch-size", type=int, nargs="+", required=True)
    ap.add_argument("--input-len", type=int, nargs="+", required=True)
    ap.add_argument("--output-len", type=int, required=True)
    a = ap.parse_args()
    with open(a.log, errors="replace") as f:
        for r in rows(f.read(), a.batch_size, a.input_len, a.output_len):
            print(json.dumps(r))


if __name__ == "__main__":
    main()
