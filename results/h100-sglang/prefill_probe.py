"""How long is one prefill step, by its size? A direct probe of the prefill step's shape.

The simulator charges a prefill step a fixed cost (launch and batch building: ``overhead.*prefill*``,
fitted on the studies' windows) plus its kernels (the roofline at the fitted efficiencies, or the
operator tables). The studies' windows mix many prefills with decodes, so they constrain the sum at
their typical sizes but not how it splits between the fixed part and the per-token slope. This
probe measures lone prompts on an idle server, with prefill CUDA graphs (SGLang's default) and
without (``--disable-prefill-cuda-graph``, as the studies run), and with a cached prefix (a
multi-turn extend), and prints them beside the simulator's step for the same shape.

On a GPU machine with the SGLang kit (results/h100-sglang/prefill_probe.sh runs it):

    python results/h100-sglang/prefill_probe.py --out DIR [--reps 6] [--modes eager,graph]

For each mode it starts one server (Qwen3-30B-A3B fp8 weights and KV, random weights, the H100
study's trial 1 flags, chunked prefill 8,192), sends each pattern --reps times with fresh random
prompts, and writes DIR/prefill-probe.json: every request's client TTFT and its tokens' arrival
times. Patterns: ``new-N`` (a prompt of N tokens, nothing cached) and ``prefix-P+N`` (a prompt of P
tokens sent once, then the same P tokens plus N new ones: an extend of N over a cached P).
`--report DIR` prints the medians beside the simulator (CPU only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_probe import MODEL, VOCAB_HI, VOCAB_LO, serving, sglang_command  # noqa: E402
from tuner.catalog import get_model  # noqa: E402

FLAGS = {"tp-size": 1, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "mem-fraction-static": 0.85,
         "attention-backend": "triton", "sampling-backend": "pytorch", "schedule-policy": "fcfs",
         "chunked-prefill-size": 8192}
MODES = {"eager": {"disable-prefill-cuda-graph": True}, "graph": {}}
NEW = (64, 256, 1024, 2048, 4096, 8192)
PREFIX = ((4096, 256), (16384, 1024))
# the models a call can probe: (model as a study names it, flags over FLAGS, new-prompt sizes, (prefix, new) extends)
PROBES = {
    "qwen3": (MODEL, {}, NEW, PREFIX),
    # DeepSeek-V3 with 5 of its layers (3 dense, 2 MoE: the 8 of the H200 study's model run out of
    # memory on an 80 GB GPU while SGLang fills their random weights): MLA prefill without a prefix
    # (MHA over expanded K/V) and extends over cached prefixes (SGLang's Triton absorbed kernel)
    "dsv3-5l": ({"name": "deepseek-v3", "overrides": {"num_hidden_layers": 5}},
                {"cuda-graph-max-bs": 8, "max-running-requests": 8},
                (1024, 4096, 8192), ((4096, 256), (4096, 2048), (16384, 2048), (32768, 512), (32768, 2048))),
}
OUTPUT_TOKENS = 16


def patterns(probe: str = "qwen3") -> list[tuple[str, int, int]]:
    """(name, cached prefix tokens, new tokens)."""
    _model, _flags, new, prefix = PROBES[probe]
    return [(f"new-{n}", 0, n) for n in new] + [(f"prefix-{p}+{n}", p, n) for p, n in prefix]


def probe_flags(probe: str, mode: str) -> dict:
    return {**FLAGS, **PROBES[probe][1], **MODES[mode]}


def write_model(model_dir: str, probe: str) -> None:
    from tuner.profile import build_plan
    from tuner.profile.modelcfg import write_model_dir

    p = build_plan(PROBES[probe][0], "h100", {"tp-size": 1, "attention-backend": "triton", "quantization": "fp8"})
    write_model_dir(p.model, p.ckpt, model_dir)


def server_command(model_dir: str, port: int, mode: str, probe: str = "qwen3") -> list[str]:
    return sglang_command(model_dir, port, probe_flags(probe, mode))


async def generate(session, base: str, ids: list[int]) -> dict:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True, "temperature": 0.0}}
    t0 = time.perf_counter()
    arrivals = []
    async with session.post(base + "/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                arrivals.append(time.perf_counter() - t0)
    return {"tokens": len(ids), "ttft_s": arrivals[0] if arrivals else None, "arrivals_s": arrivals}


async def run_pattern(session, base: str, prefix: int, new: int, rng: random.Random, vocab_hi: int = VOCAB_HI) -> dict:
    ids = [rng.randrange(VOCAB_LO, vocab_hi) for _ in range(prefix + new)]
    if prefix:
        await generate(session, base, ids[:prefix])  # caches the prefix
        await asyncio.sleep(0.3)
    return await generate(session, base, ids)


async def serve_and_probe(mode: str, model_dir: str, out: Path, reps: int, port: int, seed: int,
                          probe: str = "qwen3") -> list[dict]:
    rows = []
    async with serving(server_command(model_dir, port, mode, probe), out / f"server-{mode}.log", port,
                       mode) as (session, base):
        rng = random.Random(seed)
        vocab_hi = min(VOCAB_HI, get_model(PROBES[probe][0]).vocab_size - 1)  # ids past it trip a device assert
        for _name, prefix, new in patterns(probe):  # warm-up: every shape once (kernel compiles)
            await run_pattern(session, base, prefix, new, rng, vocab_hi)
            await asyncio.sleep(0.3)
        for rep in range(reps):
            for name, prefix, new in patterns(probe):
                got = await run_pattern(session, base, prefix, new, rng, vocab_hi)
                rows.append({"mode": mode, "pattern": name, "prefix": prefix, "new": new, "rep": rep, **got})
                await asyncio.sleep(0.3)  # idle between patterns: each starts on an empty server
        print(f"{mode}: {len(rows)} requests measured", flush=True)
    return rows


def predicted_ms(mode: str, gpu: str, probe: str = "qwen3") -> dict[str, tuple[float, float]]:
    """The simulator's prefill step and its batch-1 decode step for each pattern, in ms."""
    from tuner.catalog import get_gpu, get_model
    from tuner.sim.simulate import _prepare
    from tuner.sim.steptime import RankWork

    flags = {**probe_flags(probe, mode), "load-format": "dummy"}  # random weights (a collapsed router)
    sm = _prepare(get_model(PROBES[probe][0]), get_gpu(gpu), 1, flags, {}, 1, None, None, "0.5.17")[3]
    out = {}
    for name, prefix, new in patterns(probe):
        w = RankWork()
        w.prefill_tokens, w.prefill_seqs = new, 1
        w.prefill_ctx_units = new * prefix + new * new / 2
        w.extend_items = ((new, prefix),)
        d = RankWork()
        d.decode_reqs, d.decode_ctx_tokens = 1, prefix + new
        out[name] = (sm.step_time([w], 1) * 1e3, sm.step_time([d], 1) * 1e3)
    return out


def report(out: Path) -> None:
    doc = json.loads((out / "prefill-probe.json").read_text())
    gpu = doc.get("gpu", "h100")
    probe = doc.get("probe", "qwen3")
    print(f"{gpu}: lone prompts on an idle server, median over reps (ms); sim = the simulator's step")
    print(f"{'mode':6s} {'pattern':18s} {'TTFT':>7s} {'sim prefill':>12s} {'TPOT':>6s} {'sim decode':>11s}")
    for mode in dict.fromkeys(r["mode"] for r in doc["rows"]):
        pred = predicted_ms(mode, gpu, probe)
        for name, _p, _n in patterns(probe):
            rows = [r for r in doc["rows"] if r["mode"] == mode and r["pattern"] == name and r["ttft_s"]]
            if not rows:
                continue
            ttft = statistics.median(r["ttft_s"] for r in rows) * 1e3
            gaps = [b - a for r in rows for a, b in zip(r["arrivals_s"][1:], r["arrivals_s"][2:])]
            tpot = statistics.median(gaps) * 1e3 if gaps else float("nan")
            sp, sd = pred[name]
            print(f"{mode:6s} {name:18s} {ttft:7.1f} {sp:12.1f} {tpot:6.2f} {sd:11.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--modes", default="eager,graph", help=f"servers in order, of {', '.join(MODES)}")
    ap.add_argument("--probe", default="qwen3", choices=sorted(PROBES), help="the model and its prompt shapes")
    ap.add_argument("--gpu", default="h100", help="the catalog GPU the call runs on (for --report's simulator)")
    ap.add_argument("--port", type=int, default=31100)
    ap.add_argument("--report", action="store_true", help="print the committed result beside the simulator (CPU)")
    args = ap.parse_args()
    if args.report:
        report(args.out)
        return
    modes = args.modes.split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {', '.join(bad)}; valid: {', '.join(MODES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = "/tmp/model-gate-probe"
    write_model(model_dir, args.probe)
    rows = []
    for i, mode in enumerate(modes):
        rows += asyncio.run(serve_and_probe(mode, model_dir, args.out, args.reps, args.port + i, seed=11 + i,
                                            probe=args.probe))
        (args.out / "prefill-probe.json").write_text(json.dumps({
            "probe": args.probe, "model": PROBES[args.probe][0], "gpu": args.gpu,
            "flags": {**FLAGS, **PROBES[args.probe][1]}, "modes": MODES, "output_tokens": OUTPUT_TOKENS,
            "patterns": [p[0] for p in patterns(args.probe)], "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
