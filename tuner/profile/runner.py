"""Run a profile plan: time every operator over its grid and write the table format the simulator
reads (``tuner.sim.optable``)."""

from __future__ import annotations

import datetime
import json
import logging
import platform
from pathlib import Path
from typing import Callable

from tuner.errors import ConfigError
from tuner.sim.optable import FORMAT, parse_profile

from .kernels import Kernels
from .plan import ProfilePlan
from .timing import Timer

log = logging.getLogger(__name__)


def _timed(kernels_call, timer: Timer, skipped: list, label: str, host: bool = False,
           extra: dict | None = None) -> float | None:
    """One point: None (and a note) when the operator cannot run at this size. ``host``: the
    calling thread's time (``Timer.host_us``) instead of the GPU's; ``extra`` receives what else
    the timer noted (``done_us``)."""
    try:
        run = kernels_call()
    except (MemoryError, RuntimeError, ValueError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        skipped.append({"point": label, "reason": f"{type(exc).__name__}: {exc}"[:300]})
        return None
    try:
        us = round(timer.host_us(run) if host else timer.time_us(run), 3)
        if extra is not None and "done_us" in run.meta:
            extra["done_us"] = round(run.meta["done_us"], 3)
        return us
    except (MemoryError, RuntimeError, ValueError) as exc:
        skipped.append({"point": label, "reason": f"{type(exc).__name__}: {exc}"[:300]})
        return None
    finally:
        del run


def check_device(plan: ProfilePlan, device_name: str | None) -> None:
    """Refuse to time one GPU under another's name: tables are filed and looked up by ``--hardware``."""
    want = plan.gpu.torch_name
    if device_name and want and want.lower() not in device_name.lower():
        raise ConfigError(f"--hardware {plan.gpu.name} is a {want}, but this machine's GPU is {device_name!r}; "
                          f"pass the --hardware of this GPU", key="--hardware")


def run_profile(plan: ProfilePlan, kernels: Kernels, timer: Timer, *,
                progress: Callable[[int, int, str], None] | None = None, provenance: dict | None = None) -> dict:
    """Time the plan; returns the profile document (format ``tuner-op-profile/1``)."""
    check_device(plan, kernels.describe().get("device"))
    total = max(1, plan.points())
    done = 0
    skipped: list[dict] = []

    def tick(label):
        nonlocal done
        done += 1
        if progress:
            progress(done, total, label)

    ops: list[dict] = []
    if "gemm" in plan.ops:
        for g in plan.gemm_list:
            us = []
            for t in plan.tokens:
                label = f"gemm {g.name} n={g.n} k={g.k} {g.dtype} tokens={t}"
                us.append(_timed(lambda: kernels.gemm(g, t), timer, skipped, label))
                tick(label)
            ops.append({"op": "gemm", "name": g.name, "shape": g.key, "axes": ["tokens"],
                        "grid": {"tokens": list(plan.tokens)}, "us": us})
    attn = plan.attention
    if "decode_attention" in plan.ops and attn.arch != "dsa":
        rows = []
        for b in plan.batch:
            row = []
            for c in plan.contexts:
                label = f"decode_attention batch={b} context={c}"
                row.append(_timed(lambda: kernels.decode_attention(attn, b, c), timer, skipped, label))
                tick(label)
            rows.append(row)
        ops.append({"op": "decode_attention", "shape": attn.key, "axes": ["batch", "context"],
                    "grid": {"batch": list(plan.batch), "context": list(plan.contexts)}, "us": rows})
    if "extend_attention" in plan.ops and attn.arch != "dsa":
        for mode in plan.extend_modes:
            prefixes = (0,) if mode == "mha" and attn.arch == "mla" else plan.prefixes
            rows = []
            for n in plan.new_tokens:
                row = []
                for p in prefixes:
                    label = f"extend_attention {mode} new={n} prefix={p}"
                    row.append(_timed(lambda: kernels.extend_attention(attn, mode, n, p), timer, skipped, label))
                    tick(label)
                rows.append(row)
            ops.append({"op": "extend_attention", "mode": mode, "shape": attn.key,
                        "axes": ["new_tokens", "prefix"],
                        "grid": {"new_tokens": list(plan.new_tokens), "prefix": list(prefixes)}, "us": rows})
    moe, pool = plan.moe, plan.moe_pool
    if "moe" in plan.ops and moe is not None:
        # a table timed with a collapsed routing says so in its shape: it serves only that routing
        shape = {**moe.key, "routed_pool": pool} if pool else moe.key
        for variant in plan.moe_variants:
            us = []
            for t in plan.tokens:
                label = f"moe {variant} E={moe.experts} N={moe.n} K={moe.k}{f' pool={pool}' if pool else ''} tokens={t}"
                us.append(_timed(lambda: kernels.moe(moe, variant, t, routed_pool=pool), timer, skipped, label))
                tick(label)
            ops.append({"op": "moe", "variant": variant, "shape": shape, "axes": ["tokens"],
                        "grid": {"tokens": list(plan.tokens)}, "us": us})
    m = plan.model
    if "layer_misc" in plan.ops:
        dense_inter = m.intermediate_size // plan.layout.attn_tp if m.num_layers > m.num_moe_layers else (
            m.moe_intermediate_size * max(1, m.n_shared_experts) // plan.layout.attn_tp)
        us = []
        for t in plan.tokens:
            label = f"layer_misc tokens={t}"
            us.append(_timed(lambda: kernels.layer_misc(m.hidden_size, attn.arch, m.is_moe, attn, t, dense_inter),
                             timer, skipped, label))
            tick(label)
        ops.append({"op": "layer_misc", "shape": {"hidden": m.hidden_size, "arch": attn.arch, "moe": bool(m.is_moe)},
                    "axes": ["tokens"], "grid": {"tokens": list(plan.tokens)}, "us": us})
    if "sampling" in plan.ops:
        vocab = -(-m.vocab_size // plan.layout.tp)
        us = []
        for b in plan.batch:
            label = f"sampling vocab={vocab} batch={b}"
            us.append(_timed(lambda: kernels.sampling(vocab, b), timer, skipped, label))
            tick(label)
        ops.append({"op": "sampling", "shape": {"vocab": vocab}, "axes": ["batch"],
                    "grid": {"batch": list(plan.batch)}, "us": us})
    if "hicache_write" in plan.ops:
        hw = plan.host_write
        us, done_us = [], []
        for t in plan.write_tokens:
            label = f"hicache_write page={hw.page_size} tensors={hw.tensors} bytes={hw.element_bytes} tokens={t}"
            extra: dict = {}
            us.append(_timed(lambda: kernels.hicache_write(hw, t), timer, skipped, label, host=True, extra=extra))
            done_us.append(extra.get("done_us"))
            tick(label)
        ops.append({"op": "hicache_write", "shape": hw.key, "axes": ["tokens"],
                    "grid": {"tokens": list(plan.write_tokens)}, "us": us,
                    "timed": "scheduler-thread CPU per backup (perf_counter around the call, GPU idle before it)",
                    "done_us": done_us})  # until its copies finished: the copy engine's time, for the record
    # a table whose every point failed is no table
    ops = [o for o in ops if _any_value(o["us"])]
    lay = plan.layout
    doc = {
        "format": FORMAT,
        "gpu": plan.gpu.name,
        "device_name": plan.gpu.torch_name,
        "sglang_version": plan.sglang_version,
        "attention_backend": plan.attention_backend,
        "moe_runner_backend": str(plan.flags.get("moe-runner-backend") or "triton"),
        "model": m.name,
        "weight_dtype": plan.ckpt.weight_format,
        "kv_cache_dtype": plan.kv_cache_dtype,
        "parallel": {"tp_size": lay.tp, "attn_tp": lay.attn_tp, "attn_dp": lay.attn_dp, "ep": lay.ep,
                     "moe_tp": lay.moe_tp},
        "flags": dict(plan.flags),
        "provenance": {
            "tool": "tuner profile",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "python": platform.python_version(),
            **timer.describe(),
            **kernels.describe(),
            **(provenance or {}),
            "skipped_points": skipped,
        },
        "ops": ops,
    }
    parse_profile(doc, "<new profile>")  # the simulator must be able to read what we write
    return doc


def _any_value(us) -> bool:
    if isinstance(us, list):
        return any(_any_value(v) for v in us)
    return us is not None


def write_profile(doc: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)  # never a half-written profile
    return path
