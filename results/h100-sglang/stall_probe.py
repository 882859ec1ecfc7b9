"""What does a fresh server stall on, and does a warm kernel cache remove it? A direct probe.

A fresh SGLang 0.5.17 server of DeepSeek-V3's shapes stalls for most of a second the first time a
prefill batch reaches a new batch-size bucket, also after the study's kernel warm-up, and also when
the server before it on the same machine had compiled the same kernels (results/h100-sglang/README.md,
"A fresh server's first traffic"). This probe asks the server directly which request shapes stall
and which kernels each one built.

One server of the H100 DeepSeek-5L study's baseline (fp8 weights and KV, Triton attention, chunked
prefill 2,048, decode CUDA graphs to 64, prefill eager), then a second one on the same machine with
the kernel caches the first one left. Each gets the same steps, each step sent twice with fresh
random ids (nothing cached but what the step caches itself):

* ``lone-N``: one prompt of N tokens, for every length the study's kernel warm-up sends
  (tuner.workload.kernel_warmup.prompt_lengths), in its order: the warm-up itself;
* ``extend-P+N``: a prompt of P tokens, then the same P plus N new ones (a multi-turn extend);
* ``burst-KxN``: K prompts of N tokens sent at once (a prefill batch of several requests);
* ``burst-extend-KxP+N``: K prompts of P tokens, then all K extended by N at once;
* ``decode-KxN``: K prompts of N tokens with 64 output tokens each (decode batches of up to K);
* ``join-N``: a prompt of N tokens sent while 8 requests decode.

For each send it records every request's client TTFT and end-to-end time, and the files that
appeared in the kernel caches meanwhile (Triton's ``~/.triton/cache`` and Inductor's
``/tmp/torchinductor_<user>/triton``, where Triton's cache moves once a torch.compile kernel
loads). The first send minus the repeat is the step's stall. The server runs with
``TORCH_LOGS=recompiles`` so its log also says when torch.compile recompiled.

On a GPU machine with the SGLang kit (results/h100-sglang/stall_probe.sh runs it):

    python results/h100-sglang/stall_probe.py --out DIR [--servers cold,warm]

``--report DIR`` prints each step's stall for each server and the kernels it built (CPU only).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import glob
import gzip
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_probe import VOCAB_LO, VOCAB_HI, serving, sglang_command  # noqa: E402
from prefill_probe import PROBES, write_model  # noqa: E402
from tuner.catalog import get_model  # noqa: E402
from tuner.kernels.targets import SGLANG_BATCH_SIZES  # noqa: E402
from tuner.workload.kernel_warmup import prompt_lengths  # noqa: E402

# the H100 DeepSeek-5L study's baseline (studies/h100-sglang-dsv3-5l-fresh*.yaml), as its servers ran
FLAGS = {"tp-size": 1, "quantization": "fp8", "kv-cache-dtype": "fp8_e4m3", "attention-backend": "triton",
         "sampling-backend": "pytorch", "schedule-policy": "fcfs", "chunked-prefill-size": 2048,
         "max-running-requests": 32, "cuda-graph-max-bs-decode": 64, "disable-prefill-cuda-graph": True,
         "enable-metrics": True}
CHUNK = 2048
PREFIX = 1024
# a glog line's time (TORCH_LOGS), after any prefix such as "[rank0]:": V1207 01:50:12.345000
GLOG_TIME = re.compile(r"[IWEV](\d{4}) (\d\d:\d\d:\d\d\.\d+) ")
KINDS = ("lone", "extend", "burst", "decode", "join")


def steps(kinds: tuple[str, ...] = KINDS, lone: tuple[int, ...] | None = None) -> list[tuple[str, str, tuple]]:
    """(name, kind, arguments) in the order each server gets them (only those of ``kinds``; ``lone``:
    the lone prompts' lengths, default the kernel warm-up's)."""
    lone = lone or prompt_lengths(SGLANG_BATCH_SIZES, SGLANG_BATCH_SIZES[-1] + 1)
    out = [(f"lone-{n}", "lone", (n,)) for n in lone]
    out += [(f"extend-{PREFIX}+{n}", "extend", (1, PREFIX, n)) for n in (1, 3, 16, 17, 100, 300, 700, 1500)]
    out += [(f"extend-3000+{n}", "extend", (1, 3000, n)) for n in (50, 1200)]
    out += [(f"burst-{k}x{n}", "burst", (k, n)) for k, n in ((2, 150), (3, 150), (4, 301), (8, 100), (16, 60))]
    out += [(f"burst-extend-{k}x{PREFIX}+{n}", "extend", (k, PREFIX, n)) for k, n in ((2, 80), (4, 80), (8, 33))]
    out += [(f"decode-{k}x200", "decode", (k, 200)) for k in (8, 32)]
    out += [(f"join-{n}", "join", (n,)) for n in (400, 1500)]
    return [s for s in out if s[1] in kinds]


#: the servers' TRITON_CACHE_DIR (--triton-cache-dir), where set: Inductor then leaves it as it is
TRITON_CACHE_DIR: str | None = None


def cache_dirs() -> list[str]:
    home = os.path.expanduser("~/.triton/cache")
    return [*([TRITON_CACHE_DIR] if TRITON_CACHE_DIR else []), home, *sorted(glob.glob("/tmp/torchinductor_*/triton"))]


def cache_files() -> dict[str, float]:
    """Every file under the kernel caches: path -> mtime."""
    out = {}
    for d in cache_dirs():
        for root, _dirs, files in os.walk(d):
            for f in files:
                p = os.path.join(root, f)
                try:
                    out[p] = os.stat(p).st_mtime
                except OSError:
                    pass
    return out


def kernel_names(paths) -> list[str]:
    """The kernels among new cache files (one per compiled kernel: its .json metadata, not the group file)."""
    return sorted(Path(p).stem for p in paths if p.endswith(".json") and not Path(p).name.startswith("__grp__"))


class Sender:
    def __init__(self, session, base: str, rng: random.Random, vocab_hi: int):
        self.session, self.base, self.rng, self.vocab_hi = session, base, rng, vocab_hi

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB_LO, self.vocab_hi) for _ in range(n)]

    async def generate(self, ids: list[int], out_tokens: int = 2) -> dict:
        body = {"input_ids": ids, "stream": True,
                "sampling_params": {"max_new_tokens": out_tokens, "ignore_eos": True, "temperature": 0.0}}
        t0 = time.perf_counter()
        first = None
        async with self.session.post(self.base + "/generate", json=body) as r:
            r.raise_for_status()
            async for line in r.content:
                if line.startswith(b"data:") and b"[DONE]" not in line and first is None:
                    first = time.perf_counter()
        end = time.perf_counter()
        return {"tokens": len(ids), "sent_unix_s": time.time() - (end - t0),
                "ttft_s": None if first is None else first - t0, "e2e_s": end - t0}

    async def step(self, kind: str, args: tuple) -> list[dict]:
        """The step's measured requests (setup requests, e.g. a prefix's first send, are not returned)."""
        if kind == "lone":
            return [await self.generate(self.ids(args[0]))]
        if kind == "burst":
            k, n = args
            return list(await asyncio.gather(*(self.generate(self.ids(n)) for _ in range(k))))
        if kind == "extend":
            k, p, n = args
            prefixes = [self.ids(p) for _ in range(k)]
            for ids in prefixes:  # one at a time: each prefix a lone prompt of a length already run
                await self.generate(ids)
            await asyncio.sleep(0.2)
            return list(await asyncio.gather(*(self.generate(ids + self.ids(n)) for ids in prefixes)))
        if kind == "decode":
            k, n = args
            return list(await asyncio.gather(*(self.generate(self.ids(n), 64) for _ in range(k))))
        if kind == "join":
            running = [asyncio.create_task(self.generate(self.ids(200), 200)) for _ in range(8)]
            await asyncio.sleep(0.5)
            got = await self.generate(self.ids(args[0]))
            await asyncio.gather(*running)
            return [got]
        raise ValueError(kind)


async def probe_server(label: str, model_dir: str, out: Path, port: int, seed: int, vocab_hi: int, rows: list[dict],
                       kinds: tuple[str, ...] = KINDS, lone: tuple[int, ...] | None = None,
                       flags: dict | None = None) -> None:
    """Each send's record appended to ``rows`` as it ends (a run cut off keeps what it measured)."""
    env_before = dict(os.environ)
    os.environ["TORCH_LOGS"] = "recompiles"  # the server's log says when torch.compile recompiles
    if TRITON_CACHE_DIR:
        os.environ["TRITON_CACHE_DIR"] = TRITON_CACHE_DIR
    try:
        async with serving(sglang_command(model_dir, port, flags or FLAGS), out / f"server-{label}.log", port,
                           label) as (session, base):
            os.environ.clear()
            os.environ.update(env_before)
            sender = Sender(session, base, random.Random(seed), vocab_hi)
            for name, kind, args in steps(kinds, lone):
                for send in ("first", "repeat"):
                    before = cache_files()
                    t0 = time.time()
                    got = await sender.step(kind, args)
                    new = sorted(set(cache_files()) - set(before))
                    rows.append({"server": label, "step": name, "kind": kind, "send": send, "t_unix_s": t0,
                                 "requests": got, "new_files": len(new), "new_kernels": kernel_names(new)})
                    await asyncio.sleep(0.3)  # each send starts on an idle server
            print(f"{label}: {sum(r['server'] == label for r in rows)} sends", flush=True)
    finally:
        os.environ.clear()
        os.environ.update(env_before)


def stall_s(rows: list[dict], server: str, step: str) -> tuple[float, float, float] | None:
    """(first send's slowest TTFT, the repeat's, their difference) in s."""
    got = {r["send"]: max((q["ttft_s"] or 0.0) for q in r["requests"]) for r in rows
           if r["server"] == server and r["step"] == step}
    if set(got) != {"first", "repeat"}:
        return None
    return got["first"], got["repeat"], got["first"] - got["repeat"]


def recompiles(out: Path, server: str, year: int) -> list[tuple[float, str]]:
    """(unix time, function) of each torch.compile recompile the server's log shows (TORCH_LOGS's
    glog lines, e.g. ``V1207 01:50:12.345000 123 .../guards.py:2790] [0/1] [__recompiles]
    Recompiling function biased_grouped_topk_impl in ...``; UTC, as the machine's clock)."""
    path = next((p for p in (out / f"server-{server}.log", out / f"server-{server}.log.gz") if p.exists()), None)
    if path is None:
        return []
    text = (gzip.open(path, "rt", errors="replace") if path.suffix == ".gz" else open(path, errors="replace")).read()
    found = []
    for line in text.splitlines():
        if "Recompiling function" not in line or not (m := GLOG_TIME.search(line)):
            continue
        t = dt.datetime.strptime(f"{year}{m.group(1)} {m.group(2)}", "%Y%m%d %H:%M:%S.%f")
        fn = line.split("Recompiling function", 1)[1].split()[0]
        found.append((t.replace(tzinfo=dt.timezone.utc).timestamp(), fn))
    return found


def step_of(rows: list[dict], server: str, t: float) -> tuple[str, str] | None:
    """The (step, send) of ``server`` running at unix time ``t``."""
    sends = [r for r in rows if r["server"] == server]
    hit = None
    for r in sends:
        if r["t_unix_s"] <= t:
            hit = (r["step"], r["send"])
    return hit


def model_check(rows: list[dict], flags: dict | None = None,
                gpu_device_name: str = "NVIDIA H100 80GB HBM3") -> tuple[int, int, str]:
    """The simulator's kernel-variant model (``tuner.sim.warmup.KernelWarmup``, SGLang 0.5.17's files
    for the device, the server's captured decode sizes) over the lone prompts in their order, each as
    the chunks the server ran: (steps it calls as the first server did, steps, one line per step:
    model, first server, second server; S stalled more than 0.25 s)."""
    from tuner.planner.memory import decode_capture_sizes
    from tuner.sim.warmup import KernelWarmup, default_split_m, groups_for, server_linears, triton_moe_shape

    model = get_model(PROBES["dsv3-5l"][0])
    flags = {"quantization": FLAGS["quantization"]}
    shape = triton_moe_shape(model, "fp8_block", 1, 1, flags)
    groups = groups_for(shape, {}, gpu_device_name, "0.5.17")
    kw = KernelWarmup(0.5, groups, shape.topk, default_split_m=default_split_m(shape, groups),
                      linears=server_linears(model, "fp8_block", 1, 1, flags, gpu_device_name, "0.5.17"),
                      precompiled_tokens=() if (flags or FLAGS).get("disable-cuda-graph")
                      else decode_capture_sizes(FLAGS["max-running-requests"]))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    agree, n, cells = 0, 0, []
    for name in dict.fromkeys(r["step"] for r in rows if r["kind"] == "lone"):
        m = int(name.split("-")[1])
        # the first prompt ran beside SGLang's own 3-token warm-up request (the server's log)
        chunks = [1, 3] if m == 1 else [CHUNK] * (m // CHUNK) + ([m % CHUNK] if m % CHUNK else [])
        pred = any([kw.reaches_new(c) for c in chunks])  # every chunk marks its variants run
        got = [(g := stall_s(rows, s, name)) is not None and g[2] > 0.25 for s in servers]
        n, agree = n + 1, agree + (pred == got[0])
        cells.append(f"{name}:{'S' if pred else '-'}" + "".join("S" if x else "-" for x in got))
    return agree, n, " ".join(cells)


def gemm_builds_check(rows: list[dict], sglang_dir: Path,
                      device_file: str = "NVIDIA_H100_80GB_HBM3") -> tuple[int, int, list[tuple[str, int, int]]]:
    """How many block-fp8 GEMM kernels each lone prompt of the first server built, against a rule
    read off SGLang's launch (``fp8_kernel.py::w8a8_block_fp8_matmul_triton``) and Triton's
    specialisation of integer arguments: a build per new (tile config of the key nearest M in the
    weight shape's file, or SGLang's default; M divisible by 16; M = 1; the scale tensors' row stride
    K/128 divisible by 16), shared by every weight shape; the decode capture's batch sizes built
    theirs, except for ``kv_b_proj``, which MLA's absorbed decode does not run; the first prompt ran
    beside SGLang's own 3-token warm-up request. Returns (prompts whose count it gets exactly, prompts,
    [(prompt, rule's count, server's count)])."""
    from tuner.kernels.config_groups import BLOCK_FP8_DEFAULT_CONFIG
    from tuner.planner.memory import decode_capture_sizes
    from tuner.sim.warmup import block_fp8_linear_shapes

    model = get_model(PROBES["dsv3-5l"][0])
    shapes = block_fp8_linear_shapes(model, "fp8_block", 1, 1, {"quantization": FLAGS["quantization"]})
    configs = {}
    for shape in shapes:
        f = Path(sglang_dir) / "kernels" / "ops" / "quantization" / "configs" / (
            f"{shape},device_name={device_file},dtype=fp8_w8a8,block_shape=[128, 128].json")
        configs[shape] = {int(k): v for k, v in json.loads(f.read_text()).items()} if f.is_file() else None

    def kernels(m: int, which) -> set:
        out = set()
        for shape in which:
            c = configs[shape]
            cfg = BLOCK_FP8_DEFAULT_CONFIG if not c else c[min(c, key=lambda k: abs(k - m))]
            k = int(shape.split("K=")[1])
            out.add((json.dumps(cfg, sort_keys=True), m % 16 == 0, m == 1, (k // 128) % 16 == 0))
        return out

    decode_shapes = [s for s in shapes if s != "N=32768,K=512"]  # kv_b_proj: prefill (MHA) only
    seen = set()
    for m in decode_capture_sizes(FLAGS["max-running-requests"]):
        seen |= kernels(m, decode_shapes)
    out = []
    for r in rows:
        if r["server"] != rows[0]["server"] or r["send"] != "first" or r["kind"] != "lone":
            continue
        m = int(r["step"].split("-")[1])
        ms = [1, 3] if m == 1 else [CHUNK] * (m // CHUNK) + ([m % CHUNK] if m % CHUNK else [])
        new = set()
        for x in ms:
            new |= kernels(x, shapes) - seen
        seen |= new
        out.append((r["step"], len(new), sum(k == "_w8a8_block_fp8_matmul" for k in r["new_kernels"])))
    return sum(a == b for _, a, b in out), len(out), out


def report(out: Path, sglang_dir: Path | None = None) -> None:
    doc = json.loads((out / "stall-probe.json").read_text())
    rows = doc["rows"]
    servers = list(dict.fromkeys(r["server"] for r in rows))
    print("slowest TTFT of each step's first send and of its repeat (ms), and the kernels the first send built")
    print(f"{'step':26s}" + "".join(f" {s + ' first':>11s} {'repeat':>7s} {'stall':>7s}" for s in servers) + "  kernels built")
    for name in dict.fromkeys(r["step"] for r in rows):
        line = f"{name:26s}"
        for s in servers:
            got = stall_s(rows, s, name)
            line += "".join(f" {x * 1e3:11.0f}" if i == 0 else f" {x * 1e3:7.0f}" for i, x in enumerate(got)) \
                if got else f" {'-':>11s} {'-':>7s} {'-':>7s}"
        built = {s: [k for r in rows if r["server"] == s and r["step"] == name and r["send"] == "first"
                     for k in r["new_kernels"]] for s in servers}
        print(line + "  " + "; ".join(f"{s}: {', '.join(v)}" for s, v in built.items() if v))
    for s in servers:
        year = dt.datetime.fromtimestamp(rows[0]["t_unix_s"], dt.timezone.utc).year
        for t, fn in recompiles(out, s, year):
            print(f"{s}: torch.compile recompiled {fn} during {step_of(rows, s, t) or 'start-up'}")
    for s in servers:
        stalls = [got[2] for name in dict.fromkeys(r["step"] for r in rows)
                  if (got := stall_s(rows, s, name)) and got[2] > 0.25]
        print(f"{s}: {len(stalls)} steps stalled more than 0.25 s, {sum(stalls):.1f} s in all")
    agree, n, cells = model_check(rows, doc.get("flags"))
    print(f"the simulator's kernel-variant model calls {agree} of {n} lone prompts as the first server did "
          f"(model, then each server; S: stalled):\n  {cells}")
    if sglang_dir is not None:
        exact, n, counts = gemm_builds_check(rows, sglang_dir)
        print(f"block-fp8 GEMM builds per lone prompt, SGLang's launch rule against the first server: {exact} of {n} "
              f"exact\n  " + " ".join(f"{name}:{a}/{b}" for name, a, b in counts if a or b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--servers", default="cold,warm",
                    help="servers in order: cold (kernel caches emptied first) or warm (as the last one left them)")
    ap.add_argument("--steps", default=",".join(KINDS), help=f"which kinds of step to send, of {', '.join(KINDS)}")
    ap.add_argument("--lone", default=None, help="the lone prompts' lengths, comma-separated (default: the warm-up's)")
    ap.add_argument("--no-cuda-graph", action="store_true",
                    help="start without CUDA graphs (a faster start; torch.compile then compiles at first traffic)")
    ap.add_argument("--triton-cache-dir", default=None,
                    help="the servers' TRITON_CACHE_DIR (default: unset, as SGLang runs by default)")
    ap.add_argument("--port", type=int, default=31300)
    ap.add_argument("--report", action="store_true", help="print the committed result (CPU)")
    ap.add_argument("--sglang-dir", type=Path, default=None,
                    help="with --report: SGLang's package directory (its block-fp8 config files), to check the "
                         "GEMM builds against SGLang's launch rule")
    args = ap.parse_args()
    if args.report:
        report(args.out, args.sglang_dir)
        return
    global TRITON_CACHE_DIR
    TRITON_CACHE_DIR = args.triton_cache_dir
    servers = args.servers.split(",")
    bad = [s for s in servers if s not in ("cold", "warm")]
    if bad:
        ap.error(f"--servers: unknown {', '.join(bad)}; valid: cold, warm")
    kinds = tuple(args.steps.split(","))
    if not kinds or set(kinds) - set(KINDS):
        ap.error(f"--steps: unknown {', '.join(sorted(set(kinds) - set(KINDS)))}; valid: {', '.join(KINDS)}")
    lone = tuple(int(x) for x in args.lone.split(",")) if args.lone else None
    flags = {**FLAGS, **({"disable-cuda-graph": True} if args.no_cuda_graph else {})}
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = "/tmp/model-stall-probe"
    write_model(model_dir, "dsv3-5l")
    vocab_hi = min(VOCAB_HI, get_model(PROBES["dsv3-5l"][0]).vocab_size - 1)
    rows, listing = [], {}

    def write() -> None:
        (args.out / "stall-probe.json").write_text(json.dumps({
            "model": PROBES["dsv3-5l"][0], "flags": flags, "triton_cache_dir": TRITON_CACHE_DIR, "servers": servers,
            "cache_dirs": cache_dirs(), "steps": [s[0] for s in steps(kinds, lone)], "rows": rows,
            "cache_after": listing}, indent=1))

    try:
        for i, server in enumerate(servers):
            if server == "cold":
                for d in cache_dirs():
                    shutil.rmtree(d, ignore_errors=True)
            label = f"{server}{i}"
            asyncio.run(probe_server(label, model_dir, args.out, args.port + i, seed=23 + i, vocab_hi=vocab_hi,
                                     rows=rows, kinds=kinds, lone=lone, flags=flags))
            listing[label] = {p: round(m, 3) for p, m in sorted(cache_files().items())}
    finally:  # also when the call's limit interrupts it: the sends measured so far
        write()


if __name__ == "__main__":
    main()
