"""How much CPU does SGLang's scheduler spend on a decode step, and on each running request?

The simulator's decode step is ``max(GPU time, scheduler CPU)`` with the overlap scheduler, the CPU
being ``overhead.cpu_step_s + running requests x overhead.per_request_s``. The studies' windows fit
both together with the GPU terms, and the fit can trade one for the other (a fit that drops the CPU
floor and slows the GPU explains the same windows). This probe separates them: the same server
flags with the full model and with only ``--layers`` of its layers (``num_hidden_layers`` in its
config.json: the GPU step shrinks to the lm_head, sampling and those layers; the scheduler's work
per step and per request does not change), each with 1 to 96 requests decoding side by side. The
thin server's decode step is the scheduler's floor wherever it is longer than its small GPU step.

On a GPU machine with the SGLang kit (results/h100-sglang/sched_probe.sh runs it):

    python results/h100-sglang/sched_probe.py --out DIR [--servers thin,full] [--layers 2]

For each server and each count of concurrent requests it sends that many streaming requests of
``PROMPT_TOKENS`` random tokens and ``OUTPUT_TOKENS`` output tokens together and keeps every
token's arrival time; DIR/sched-probe.json holds them. A request's steady decode step is the median
gap between its tokens while every request of the round is still running. `--report DIR` (or `--report FILE`) prints
the medians beside the simulator's step and its CPU floor (CPU only). `--prompt-tokens` and
`--concurrency` probe the CPU per request at long contexts.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_probe import MODEL, VOCAB_HI, VOCAB_LO, serving, sglang_command  # noqa: E402

FLAGS = {"tp-size": 1, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.85,
         "attention-backend": "triton", "sampling-backend": "pytorch", "schedule-policy": "fcfs",
         "chunked-prefill-size": 4096, "cuda-graph-max-bs": 128, "disable-prefill-cuda-graph": True}
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 96)
PROMPT_TOKENS = 64
OUTPUT_TOKENS = 160
FULL_LAYERS = 48  # Qwen3-30B-A3B


def write_model(model_dir: str, layers: int) -> None:
    from tuner.profile import build_plan
    from tuner.profile.modelcfg import write_model_dir

    model = {"name": MODEL, "overrides": {"num_hidden_layers": layers}} if layers != FULL_LAYERS else MODEL
    p = build_plan(model, "h100", {"tp-size": 1, "attention-backend": "triton", "quantization": "fp8"})
    write_model_dir(p.model, p.ckpt, model_dir)


async def stream(session, base: str, rng: random.Random, prompt_tokens: int = PROMPT_TOKENS) -> list[float]:
    ids = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(prompt_tokens)]
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0}}
    arrivals = []
    async with session.post(base + "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                arrivals.append(time.perf_counter())
    return arrivals


async def serve_and_probe(label: str, layers: int, out: Path, port: int, seed: int, prompt_tokens: int,
                          concurrency: tuple[int, ...], flags: dict, log_tag: str = "") -> list[dict]:
    model_dir = f"/tmp/model-sched-{layers}"
    write_model(model_dir, layers)
    rows = []
    log = out / f"server-{label}{log_tag}.log"
    async with serving(sglang_command(model_dir, port, flags), log, port, label) as (session, base):
        rng = random.Random(seed)
        await asyncio.gather(*(stream(session, base, rng) for _ in range(8)))  # warm-up
        for n in concurrency:
            t0 = time.perf_counter()
            got = await asyncio.gather(*(stream(session, base, rng, prompt_tokens) for _ in range(n)))
            rows.append({"server": label, "layers": layers, "concurrency": n, "prompt_tokens": prompt_tokens,
                         "arrivals_s": [[round(t - t0, 6) for t in a] for a in got]})
            print(f"{label}: {n} requests, {steady_step_ms(rows[-1]):.2f} ms a step", flush=True)
            await asyncio.sleep(0.5)
    return rows


def steady_step_ms(row: dict) -> float:
    """The median gap between tokens while every request of the round was still decoding."""
    arrivals = [a for a in row["arrivals_s"] if len(a) > 2]
    if not arrivals:
        return float("nan")
    start = max(a[1] for a in arrivals)  # the last request's first decode token
    end = min(a[-1] for a in arrivals)  # the first request to finish
    gaps = [b - a for r in arrivals for a, b in zip(r[1:], r[2:]) if a >= start and b <= end]
    return statistics.median(gaps) * 1e3 if gaps else float("nan")


QUEUE_BUCKETS = ((0, 0), (1, 15), (16, 63), (64, None))
DECODE_LINE = re.compile(r"#running-req: (\d+).*gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)")


def server_steps(log: Path) -> dict[tuple[int, int], list[float]]:
    """The server's own decode steps (ms, from its ``Decode batch`` lines: running / throughput) by
    (running requests, index of the waiting-queue bucket)."""
    opener = gzip.open if log.suffix == ".gz" else open
    steps: dict[tuple[int, int], list[float]] = {}
    with opener(log, "rt") as f:
        for line in f:
            m = DECODE_LINE.search(line)
            if not m or float(m.group(2)) <= 0:
                continue
            running, waiting = int(m.group(1)), int(m.group(3))
            bucket = next(i for i, (lo, hi) in enumerate(QUEUE_BUCKETS) if lo <= waiting and (hi is None or waiting <= hi))
            steps.setdefault((running, bucket), []).append(running / float(m.group(2)) * 1e3)
    return steps


def report_server_logs(out: Path) -> None:
    logs = sorted(out.glob("server-*.log*")) if out.is_dir() else []
    for log in logs:
        steps = server_steps(log)
        if not any(b for _, b in steps):
            continue  # no waiting queue in this server's run
        print(f"{log.name}: the server's decode steps by running requests and waiting ones (median ms, lines)")
        for (running, b), v in sorted(steps.items()):
            lo, hi = QUEUE_BUCKETS[b]
            waiting = f"{lo}" if lo == hi else f"{lo}-{hi if hi is not None else ''}"
            print(f"  running {running:4d}  waiting {waiting:>6s}  {statistics.median(v):7.2f} ms ({len(v)})")


def predicted_ms(layers: int, running: int, gpu: str, prompt_tokens: int = PROMPT_TOKENS,
                 flags: dict | None = None) -> tuple[float, float]:
    """The simulator's decode step (overlap scheduler) and its CPU floor for ``running`` requests
    of the probe's length on the probe's server (``flags``: its server flags, default the
    studies'), in ms."""
    from tuner.catalog import get_gpu, get_model
    from tuner.sim.simulate import _prepare
    from tuner.sim.steptime import RankWork

    model = get_model(MODEL) if layers == FULL_LAYERS else get_model(
        {"name": MODEL, "overrides": {"num_hidden_layers": layers}})
    sm = _prepare(model, get_gpu(gpu), 1, flags or FLAGS, {}, 1, None, None, "0.5.17")[3]
    ctx = prompt_tokens + OUTPUT_TOKENS // 2
    w = RankWork(decode_reqs=running, decode_ctx_tokens=running * ctx, decode_max_ctx_tokens=ctx,
                 decode_min_ctx_tokens=ctx)
    cpu = sm.cpu_step_s + running * sm.per_req_s
    return sm.step_time([w], running) * 1e3, cpu * 1e3


def report(out: Path) -> None:
    """``out``: a result file, or a folder (its servers' logs, then every result file in it)."""
    if out.is_dir():
        report_server_logs(out)
        for path in sorted(out.glob("sched-probe*.json")):
            print(f"\n{path.name}:")
            report_one(path)
    else:
        report_one(out)


def report_one(path: Path) -> None:
    doc = json.loads(path.read_text())
    gpu = doc.get("gpu", "h100")
    on = [k for k, v in doc.get("flags", {}).items() if FLAGS.get(k) != v]
    if on:
        print("server flags beyond the probe's own: " + ", ".join(f"{k}={doc['flags'][k]}" for k in on))
    print(f"{gpu}: steady decode step by running requests (ms); sim = the simulator's step, "
          f"sim CPU = its scheduler floor (cpu_step_s + running x per_request_s)")
    print(f"{'server':6s} {'layers':>6s} {'prompt':>7s} {'running':>7s} {'measured':>9s} {'sim':>7s} {'sim CPU':>8s}")
    for row in doc["rows"]:
        prompt = row.get("prompt_tokens", PROMPT_TOKENS)
        sim, cpu = predicted_ms(row["layers"], row["concurrency"], gpu, prompt, doc.get("flags"))
        measured = steady_step_ms(row)  # none where a round outgrew the server's running limit (a queue)
        cell = f"{measured:9.2f}" if measured == measured else f"{'-':>9s}"
        print(f"{row['server']:6s} {row['layers']:6d} {prompt:7d} {row['concurrency']:7d} {cell} {sim:7.2f} {cpu:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--servers", default="thin,full", help="servers in order: thin (--layers layers), full")
    ap.add_argument("--layers", type=int, default=2, help="layers of the thin server")
    ap.add_argument("--gpu", default="h100", help="the catalog GPU the call runs on (for --report's simulator)")
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                    help="tokens of each request's prompt (a longer one: the CPU per request at long contexts)")
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)),
                    help="counts of requests decoding side by side, in order")
    ap.add_argument("--result", default="sched-probe.json", help="file name of the result under --out")
    ap.add_argument("--flag", dest="flags", action="append", default=[], metavar="NAME=VALUE",
                    help="a server flag over the studies' (e.g. max-running-requests=8: the rest of a round waits "
                         "in the queue, whose cost per step the server's log then shows); repeatable")
    ap.add_argument("--port", type=int, default=31200)
    ap.add_argument("--report", action="store_true", help="print the committed result beside the simulator (CPU)")
    args = ap.parse_args()
    if args.report:
        report(args.out)
        return
    servers = args.servers.split(",")
    bad = [s for s in servers if s not in ("thin", "full")]
    if bad:
        ap.error(f"--servers: unknown {', '.join(bad)}; valid: thin, full")
    if not 1 <= args.layers < FULL_LAYERS:
        ap.error(f"--layers: expected 1 to {FULL_LAYERS - 1}, got {args.layers}")
    try:
        concurrency = tuple(int(n) for n in args.concurrency.split(","))
    except ValueError:
        ap.error(f"--concurrency: expected comma-separated counts, got {args.concurrency!r}")
    if args.prompt_tokens < 1 or any(n < 1 for n in concurrency):
        ap.error("--prompt-tokens and --concurrency: expected positive counts")
    flags = dict(FLAGS)
    for item in args.flags:
        name, sep, value = item.partition("=")
        if not sep or not name:
            ap.error(f"--flag: expected NAME=VALUE, got {item!r}")
        flags[name] = True if value.lower() == "true" else value  # a bare switch (SGLang takes no value)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, label in enumerate(servers):
        layers = args.layers if label == "thin" else FULL_LAYERS
        tag = "" if args.result == "sched-probe.json" else "-" + Path(args.result).stem.removeprefix("sched-probe-")
        rows += asyncio.run(serve_and_probe(label, layers, args.out, args.port + i, 21 + i, args.prompt_tokens,
                                            concurrency, flags, tag))
        (args.out / args.result).write_text(json.dumps({
            "model": MODEL, "gpu": args.gpu, "flags": flags, "prompt_tokens": args.prompt_tokens,
            "output_tokens": OUTPUT_TOKENS, "rows": rows}))


if __name__ == "__main__":
    main()
