"""A stand-in for ``sglang serve`` of a given version, built from tuner's simulator, for CPU tests.

    python fake_sglang.py --sglang-version 0.5.17 --config C.yaml --model-path DIR --host H --port P [flags]

It reads its arguments the way that SGLang version does (``--config`` merged by the version's
own rules: 0.5.17 refuses any YAML key whose ``dest`` a custom action also uses; every flag
must exist in the version's flag set), loads ``DIR/config.json`` when ``--load-format dummy``,
prints SGLang-shaped start-up lines (weights, KV pool, CUDA-graph capture, ready), and serves
``/generate``, ``/v1/completions``, ``/health``, ``/server_info`` and ``/metrics`` with token
timing from tuner's simulator. Like SGLang with ``--skip-tokenizer-init``, a token id at or
above the model's ``vocab_size`` kills the server (an index-out-of-bounds in the embedding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml


def _die(msg: str, code: int = 1) -> None:
    sys.stderr.write(msg.rstrip() + "\n")
    sys.stderr.flush()
    sys.exit(code)


def merge_config(argv: list[str], fs) -> list[str]:
    """``--config`` YAML -> argv, by the target version's ConfigArgumentMerger rules."""
    if "--config" not in argv:
        return argv
    i = argv.index("--config")
    data = yaml.safe_load(Path(argv[i + 1]).read_text()) or {}
    blocked = {info.field for info in fs.flags.values() if info.config_yaml == "unsupported"}
    out: list[str] = []
    for key, value in data.items():
        dest = key.replace("-", "_")
        if dest in blocked and fs.config_yaml_rule == "dest-store-only":
            _die(f"ValueError: Unsupported config option '{dest}' with action 'DeprecatedAliasStoreAction'")
        info = fs.info(key) if key in fs else None
        if info is None:
            _die(f"sglang serve: error: unrecognized arguments: --{key}", 2)
        if isinstance(value, bool):
            if info.config_yaml == "store_true":
                if value:
                    out.append(f"--{key}")
            else:
                out += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            out += [f"--{key}", *map(str, value)]
        else:
            out += [f"--{key}", str(value)]
    return out + argv[:i] + argv[i + 2:]


def parse_flags(argv: list[str], fs) -> dict:
    flags: dict = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            _die(f"sglang serve: error: unrecognized arguments: {a}", 2)
        name, _, inline = a[2:].partition("=")
        if name not in fs:
            _die(f"sglang serve: error: unrecognized arguments: --{name}", 2)
        info = fs.info(name)
        canon = fs.canonical(name)
        if info.kind in ("store_true", "boolean_optional") or (info.kind == "custom_action" and info.type == "bool"):
            flags[canon] = True
            i += 1
            continue
        values = [inline] if inline else []
        i += 1
        while not values or (info.kind == "list" and i < len(argv) and not argv[i].startswith("--")):
            if i >= len(argv):
                _die(f"sglang serve: error: argument --{name}: expected one argument", 2)
            values.append(argv[i])
            i += 1
            if info.kind != "list":
                break
        conv = {"int": int, "float": float}.get(info.type, str)
        parsed = [conv(v) for v in values]
        flags[canon] = parsed if info.kind == "list" else parsed[0]
    return flags


def _log_moe_configs(log, model, gpu, flags: dict, gpus: int) -> str:
    """SGLang's lines for the fused-MoE config files it resolves (found in $SGLANG_MOE_CONFIG_DIR, or
    the default-config warning); "tuned" when every file was found there (the simulator then times
    the MoE with tuned tiles), else "default"."""
    from tuner.backends.moe_configs import trial_config_keys

    if not model.is_moe:
        return "default"
    fmt = "fp8_block" if flags.get("quantization") == "fp8" else "bf16"
    keys = trial_config_keys(model, gpu, fmt, tp_size=int(flags.get("tp-size") or gpus),
                             ep_size=int(flags.get("ep-size") or 1))
    root = os.environ.get("SGLANG_MOE_CONFIG_DIR")
    found = 0
    for key in keys:
        path = Path(root or "/nonexistent") / "configs" / "triton_3_6_0" / key.file_name
        if root and path.is_file():
            log(f"Using MoE kernel config from {path}.")
            found += 1
        elif key.down:
            log(f"Down MoE config file not found at {path}; reusing the tuned up-projection config")
        else:
            log(f"Using default MoE kernel config. Performance might be sub-optimal! Config file not found at {path}")
    return "tuned" if keys and found == len(keys) else "default"


def main() -> None:
    from aiohttp import web

    from tuner.catalog import get_gpu, get_model
    from tuner.catalog.sglang_flags import load_flagset
    from tuner.planner import plan_memory
    from tuner.sim.online import build_online_engine
    from tuner.sim.server import SimServer

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--sglang-version", default="0.5.17")
    ap.add_argument("--time-scale", type=float, default=float(os.environ.get("FAKE_SGLANG_TIME_SCALE", "1")))
    ours, rest = ap.parse_known_args()
    fs = load_flagset(ours.sglang_version)
    flags = parse_flags(merge_config(rest, fs), fs)
    model_path = str(flags.pop("model-path"))
    host, port = str(flags.pop("host", "127.0.0.1")), int(flags.pop("port", 30000))
    dummy = flags.pop("load-format", "auto") == "dummy"
    flags.pop("skip-tokenizer-init", None)
    metrics = bool(flags.pop("enable-metrics", False))
    gpus = len([g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",") if g]) or 1
    if not dummy:
        _die("fake_sglang: only --load-format dummy is emulated")
    model = get_model(model_path)
    gpu = get_gpu(os.environ.get("FAKE_SGLANG_GPU", "h200"))
    planner_flags = {k: v for k, v in flags.items()
                     if k in ("tp-size", "dp-size", "ep-size", "quantization", "kv-cache-dtype", "mem-fraction-static",
                              "max-running-requests", "max-total-tokens", "chunked-prefill-size",
                              "cuda-graph-max-bs-decode", "page-size", "enable-hierarchical-cache", "hicache-ratio",
                              "schedule-policy")}
    planner_flags.setdefault("tp-size", gpus)
    t0 = time.time()
    plan = plan_memory(model, gpu, gpus, planner_flags, sglang_version=ours.sglang_version)

    def log(msg: str) -> None:
        sys.stderr.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {msg}\n")
        sys.stderr.flush()

    log(f"server_args=ServerArgs(model_path='{model_path}', load_format='dummy', ...)")
    log(f"Load weight end. elapsed=0.10 s, type={model.architecture}, avail mem=80.00 GB, "
        f"mem usage={plan.weights_gb_per_gpu * 1e9 / 2**30:.2f} GB.")  # SGLang's "GB" are GiB
    if not plan.fits:
        log("Traceback (most recent call last):")
        _die(f"RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. ({plan.reason})")
    log(f"KV Cache is allocated. #tokens: {plan.kv_capacity_tokens_per_gpu}, K size: "
        f"{plan.kv_cache_gb_per_gpu / 2:.2f} GB, V size: {plan.kv_cache_gb_per_gpu / 2:.2f} GB")
    log("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4], avail mem=9.00 GB")
    if os.environ.get("FAKE_SGLANG_FAULT") == "graph_oom":
        _die("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total "
             "capacity of 139.81 GiB of which 9.87 GiB is free.")
    log("Capture target decode CUDA graph end. elapsed=0.20 s, mem usage=0.50 GB, avail mem=8.50 GB.")
    log(f"max_total_num_tokens={plan.kv_capacity_tokens_per_gpu}, chunked_prefill_size={plan.chunked_prefill_size}, "
        f"max_prefill_tokens=16384, max_running_requests={plan.max_running_requests_per_dp_rank}, "
        f"context_len={model.max_context_tokens}, available_gpu_mem=8.50 GB")

    tiles = _log_moe_configs(log, model, gpu, flags, gpus)
    engine, _ = build_online_engine(model, gpu, gpus, planner_flags, {"moe-tile-configs": tiles},
                                    sglang_version=ours.sglang_version, time_scale=ours.time_scale, plan=plan)
    server_args = {"model_path": model_path, "host": host, "port": port, "load_format": "dummy",
                   **{k.replace("-", "_"): v for k, v in flags.items()}}
    counters = {"sglang:prompt_tokens_total": 0.0, "sglang:generation_tokens_total": 0.0,
                "sglang:cached_tokens_total": 0.0, "sglang:num_requests_total": 0.0}

    class FakeSGLang(SimServer):
        def app(self):
            app = super().app()
            if metrics:
                app.router.add_get("/metrics", self.metrics)
            return app

        async def server_info(self, request):
            resp = await super().server_info(request)
            info = json.loads(resp.text)
            info["version"] = ours.sglang_version
            return web.json_response(info)

        async def metrics(self, request):
            text = "".join(f"# TYPE {k} counter\n{k}{{model_name=\"m\"}} {v}\n" for k, v in counters.items())
            return web.Response(text=text, content_type="text/plain")

        def _prompt_ids(self, body):
            ids = super()._prompt_ids(body)
            if isinstance(ids, list):
                bad = [t for t in ids if not 0 <= t < model.vocab_size]
                if bad:  # what the embedding does with such an id on the GPU
                    sys.stderr.write("../aten/src/ATen/native/cuda/Indexing.cu: indexSelectLargeIndex: "
                                     "Assertion `srcIndex < srcSelectDimSize` failed.\n"
                                     "RuntimeError: CUDA error: device-side assert triggered\n")
                    sys.stderr.flush()
                    os._exit(1)
                counters["sglang:prompt_tokens_total"] += len(ids)
                counters["sglang:num_requests_total"] += 1
            return ids

    server = FakeSGLang(engine, plan, model_name=model_path, server_args=server_args, time_scale=ours.time_scale)
    log(f"The server is fired up and ready to roll! ({time.time() - t0:.1f} s)")
    web.run_app(server.app(), host=host, port=port, print=None)


if __name__ == "__main__":
    main()
