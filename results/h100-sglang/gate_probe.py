"""Does a HiCache write-through backup wait for the step launched behind it? A direct probe.

SGLang 0.5.17 backs a prefilled prompt up to the host from the scheduler thread before it streams
the first token. The simulator's rule (docs/calibration.md, "The write-through's cost, timed"): the
thread issues ~1,000 copies, then waits for copies to finish, and the write stream only starts once
the step launched before the backup has finished its forward, all of it for an extend, nothing of
a decode CUDA graph. So a 3,000-token prompt (6,047 copies) costs ~12 ms alone (its next step is
its own decode), and ~12 ms plus the next prefill's forward when another prompt is prefilled right
behind it. A 400-token prompt (807 copies) fits the queue and costs ~1.5 ms either way.

On a GPU machine with the SGLang kit (results/h100-sglang/gate_probe.sh runs it):

    python results/h100-sglang/gate_probe.py --out DIR [--reps 8] [--modes off,on]

For each mode it starts one server (Qwen3-30B-A3B fp8 weights and KV, random weights, the H100
study's trial 1 flags, chunked prefill 4,096), sends each pattern --reps times with fresh random
prompts (no prefix hits), and writes DIR/gate-probe.json: every request's client TTFT. Patterns:
alone-N (one prompt of N tokens) and pair-N (N tokens, then 4,000 tokens sent with it: SGLang
receives the second after launching the first and prefills it in the next batch, its logs show). `--report DIR` prints on - off per pattern beside the rule's
prediction, on this machine (CPU only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODEL = "qwen3-30b-a3b"
FLAGS = {"tp-size": 1, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.85,
         "attention-backend": "triton", "sampling-backend": "pytorch", "schedule-policy": "fcfs",
         "chunked-prefill-size": 4096}
HICACHE = {"enable-hierarchical-cache": True, "hicache-ratio": 2.0}
PATTERNS = (("alone", 400), ("pair", 400), ("alone", 3000), ("pair", 3000))
SECOND_TOKENS = 4000
VOCAB_LO, VOCAB_HI = 1000, 150000


def sglang_command(model_dir: str, port: int, flags: dict) -> list[str]:
    """An SGLang server of ``model_dir``'s config.json with random weights on the loopback ``port``
    (``flags``: SGLang's flags without the dashes, True for a bare switch); the probes' one launch line."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir, "--load-format", "dummy",
           "--skip-tokenizer-init", "--host", "127.0.0.1", "--port", str(port)]
    for k, v in flags.items():
        cmd += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return cmd


def server_command(model_dir: str, port: int, hicache: bool, page_size: int = 1) -> list[str]:
    flags = {**FLAGS, **(HICACHE if hicache else {}), **({"page-size": page_size} if page_size > 1 else {})}
    return sglang_command(model_dir, port, flags)


async def wait_ready(session, base: str, proc: subprocess.Popen, limit_s: float) -> None:
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            async with session.get(base + "/get_model_info", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        await asyncio.sleep(1.0)
    raise RuntimeError(f"server not ready after {limit_s:.0f} s")


async def generate(session, base: str, tokens: int, rng: random.Random) -> dict:
    ids = [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(tokens)]
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0.0}}
    t0 = time.perf_counter()
    first = None
    async with session.post(base + "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b"data:") and b"[DONE]" not in line and first is None:
                first = time.perf_counter()
    return {"tokens": tokens, "sent_s": t0, "ttft_s": None if first is None else first - t0}


async def pattern(session, base: str, kind: str, tokens: int, rng: random.Random) -> dict:
    if kind == "alone":
        return {"first": await generate(session, base, tokens, rng)}
    first = asyncio.create_task(generate(session, base, tokens, rng))
    await asyncio.sleep(0)  # the first request goes out first
    second = asyncio.create_task(generate(session, base, SECOND_TOKENS, rng))
    return {"first": await first, "second": await second}


@contextlib.asynccontextmanager
async def serving(cmd: list[str], log_path: Path, port: int, label: str):
    """A server started with ``cmd`` (its output in ``log_path``), once ready on the loopback
    ``port``: yields (client session, base URL); on exit its whole process group is stopped."""
    import aiohttp

    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            t0 = time.time()
            await wait_ready(session, base, proc, 300)
            print(f"{label}: ready in {time.time() - t0:.0f} s", flush=True)
            yield session, base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


async def serve_and_probe(mode: str, model_dir: str, out: Path, reps: int, port: int, seed: int) -> list[dict]:
    """``mode``: off or on (HiCache), with ``:P`` for page size P (default 1)."""
    hicache, _, page = mode.partition(":")
    cmd = server_command(model_dir, port, hicache == "on", int(page or 1))
    rows = []
    async with serving(cmd, out / f"server-{mode.replace(':', '-page')}.log", port, mode) as (session, base):
        rng = random.Random(seed)
        for kind, tokens in PATTERNS:  # warm-up: every shape once (kernel compiles)
            await pattern(session, base, kind, tokens, rng)
            await asyncio.sleep(0.3)
        for rep in range(reps):
            for kind, tokens in PATTERNS:
                got = await pattern(session, base, kind, tokens, rng)
                rows.append({"mode": mode, "pattern": f"{kind}-{tokens}", "rep": rep, **got})
                await asyncio.sleep(0.3)  # idle between patterns: each starts on an empty server
        print(f"{mode}: {len(rows)} patterns measured", flush=True)
    return rows


def write_model(model_dir: str) -> None:
    from tuner.profile import build_plan
    from tuner.profile.modelcfg import write_model_dir

    p = build_plan(MODEL, "h100", {"tp-size": 1, "attention-backend": "triton", "quantization": "fp8"})
    write_model_dir(p.model, p.ckpt, model_dir)


def predicted_ms(page_size: int = 1) -> dict[str, tuple[float, float]]:
    """The rule's on - off for the first prompt, from the simulator's own step model."""
    from tuner.catalog import get_gpu, get_model
    from tuner.sim.simulate import _prepare
    from tuner.sim.steptime import RankWork

    m, g = get_model(MODEL), get_gpu("h100")
    flags = {**FLAGS, **HICACHE, **({"page-size": page_size} if page_size > 1 else {})}
    sm = _prepare(m, g, 1, flags, {}, 1, None, None, "0.5.17")[3]  # as simulate_load_point builds it
    out = {}
    for kind, tokens in PATTERNS:
        gate = 0.0
        if kind == "pair":  # the second prompt, prefilled in a batch of its own (the servers' logs)
            w = RankWork()
            w.prefill_tokens, w.prefill_seqs = SECOND_TOKENS, 1
            w.prefill_ctx_units = SECOND_TOKENS * SECOND_TOKENS / 2
            w.extend_items = ((SECOND_TOKENS, 0),)
            gate = sm.step_time([w], 1)
        out[f"{kind}-{tokens}"] = (sm.host_write_cpu_s(tokens, gate) * 1e3, gate * 1e3)
    return out


def report(out: Path) -> None:
    doc = json.loads((out / "gate-probe.json").read_text())
    pages = sorted({(r["mode"].partition(":")[2] or "1") for r in doc["rows"]}, key=int)
    for page in pages:
        print(f"page size {page}:")
        rows = [{**r, "mode": r["mode"].partition(":")[0]} for r in doc["rows"]
                if (r["mode"].partition(":")[2] or "1") == page]
        _report(rows, predicted_ms(int(page)))


def _report(rows: list[dict], pred: dict) -> None:
    def gap_ms(mode, name):  # the second prompt's first token after the first's: its prefill's forward
        v = [r["second"]["ttft_s"] - r["first"]["ttft_s"] for r in rows if r["mode"] == mode
             and r["pattern"] == name and r["second"]["ttft_s"] and r["first"]["ttft_s"]]
        return statistics.median(v) * 1e3 if v else None

    print("first prompt's TTFT, median ms; the rule's on - off with the simulator's step behind it (its length),"
          "\nand with the step measured (the second prompt's first token after the first's, HiCache off)")
    print(f"{'pattern':12s}  {'off':>8s}   {'on':>8s}   {'on - off':>8s}   {'rule':>7s} {'(step)':>8s}   "
          f"{'rule, measured step':>19s}")
    for kind, tokens in PATTERNS:
        name = f"{kind}-{tokens}"
        med = {}
        for mode in ("off", "on"):
            v = [r["first"]["ttft_s"] for r in rows if r["mode"] == mode and r["pattern"] == name
                 and r["first"]["ttft_s"] is not None]
            med[mode] = statistics.median(v) * 1e3 if v else float("nan")
        p, gate = pred[name]
        step = gap_ms("off", name) if kind == "pair" else 0.0
        drain = p - gate if p > gate else None  # the rule past the queue: gate + the copies past it
        measured_rule = f"{step + drain:+8.1f} ({step:.0f} ms)" if drain is not None and step is not None else \
            f"{p:+8.1f}"
        print(f"{name:12s}  {med['off']:8.1f}   {med['on']:8.1f}   {med['on'] - med['off']:+8.1f}   "
              f"{p:+7.1f} ({gate:4.0f} ms)   {measured_rule:>19s}")
    for mode in ("off", "on"):
        g = gap_ms(mode, "pair-3000")
        if g is not None:
            print(f"{mode}: pair-3000, second prompt's first token after the first's: median {g:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--modes", default="off,on", help="servers in order: off or on (HiCache), :P for page size P")
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--report", action="store_true", help="print the committed result against the rule (CPU)")
    args = ap.parse_args()
    if args.report:
        report(args.out)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = "/tmp/model-gate-probe"
    write_model(model_dir)
    rows = []
    for i, mode in enumerate(args.modes.split(",")):
        rows += asyncio.run(serve_and_probe(mode, model_dir, args.out, args.reps, args.port + i, seed=7 + i))
        (args.out / "gate-probe.json").write_text(json.dumps({
            "model": MODEL, "flags": FLAGS, "hicache": HICACHE, "second_tokens": SECOND_TOKENS,
            "patterns": [f"{k}-{t}" for k, t in PATTERNS], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
