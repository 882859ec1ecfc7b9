"""``tuner kernels tune``: split batch sizes over GPUs, tune, write SGLang's config file.

One worker process per GPU (CUDA_VISIBLE_DEVICES set to that GPU), each taking a contiguous run of
batch sizes so warm starts from the neighbouring batch size still apply; the CPU cores are shared
out among their compile pools. With one GPU the work runs in this process.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable

from tuner.errors import BackendUnavailableError, ConfigError
from tuner.kernels.configfile import config_relpath, write_configs
from tuner.kernels.shapes import MoEShape
from tuner.kernels.space import search_space_for
from tuner.kernels.targets import SGLANG_BATCH_SIZES

DEFAULT_BATCH_SIZES = SGLANG_BATCH_SIZES


def parse_int_list(text: str, key: str) -> list[int]:
    try:
        values = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"{text!r} is not a comma-separated list of integers", key=key) from None
    if not values or any(v < 0 for v in values):
        raise ConfigError(f"{text!r} must list non-negative integers", key=key)
    return values


def default_budget(shape: MoEShape) -> int:
    """10% of SGLang's exhaustive grid for this dtype, at most 192."""
    return min(192, math.ceil(0.1 * len(search_space_for(shape.dtype, shape.block_shape))))


def split_batches(batch_sizes: list[int], parts: int) -> list[list[int]]:
    """Contiguous, balanced runs of the ascending batch sizes (empty runs dropped)."""
    bs = sorted(set(batch_sizes))
    parts = max(1, min(parts, len(bs)))
    size, extra = divmod(len(bs), parts)
    out, i = [], 0
    for p in range(parts):
        n = size + (1 if p < extra else 0)
        out.append(bs[i:i + n])
        i += n
    return [c for c in out if c]


def _check_gpu() -> int:
    try:
        import torch
    except ImportError:
        raise BackendUnavailableError("tuning needs PyTorch and Triton with an NVIDIA GPU; torch is not "
                                      "installed") from None
    try:
        import triton  # noqa: F401
    except ImportError:
        raise BackendUnavailableError("tuning needs Triton; it is not installed") from None
    if not torch.cuda.is_available():
        raise BackendUnavailableError("no CUDA GPU is visible (torch.cuda.is_available() is False)")
    return torch.cuda.device_count()


def run_tune(shape: MoEShape, batch_sizes: list[int], budget: int, gpu_ids: list[int] | None, out_dir: Path,
             *, seed: int = 0, progress: Callable[[dict], None] | None = None) -> dict:
    visible = _check_gpu()
    if not gpu_ids:
        gpu_ids = [0]
    if len(set(gpu_ids)) != len(gpu_ids):
        raise ConfigError(f"--gpu-ids {gpu_ids} repeats a GPU", key="gpu_ids")
    if len(gpu_ids) == 1:
        if gpu_ids[0] >= visible:
            raise ConfigError(f"GPU {gpu_ids[0]} does not exist; {visible} visible", key="gpu_ids")
        from tuner.kernels.worker import tune_batch_sizes

        import torch

        torch.cuda.set_device(gpu_ids[0])
        merged = tune_batch_sizes(shape, batch_sizes, budget, seed=seed, progress=progress)
        merged["gpus"] = gpu_ids
    else:
        merged = _run_workers(shape, batch_sizes, budget, gpu_ids, seed, progress)
    configs = {r["batch_size"]: r["config"] for r in merged["results"]}
    rel = config_relpath(shape.num_experts, shape.intermediate, merged["device_name"], merged["triton_version"],
                         shape.config_dtype, shape.block_shape)
    path = write_configs(out_dir / rel, configs)
    merged["config_file"] = str(path)
    report = out_dir / "tune_report.json"
    report.write_text(json.dumps(_finite(merged), indent=2) + "\n")
    merged["report_file"] = str(report)
    return _finite(merged)


def _finite(obj):
    """JSON-safe copy: inf / nan -> None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _run_workers(shape, batch_sizes, budget, gpu_ids, seed, progress) -> dict:
    chunks = split_batches(batch_sizes, len(gpu_ids))
    cores = max(1, (os.cpu_count() or 2) - len(chunks))
    procs, tmp = [], tempfile.mkdtemp(prefix="tuner-kernels-")
    for gpu, chunk in zip(gpu_ids, chunks):
        req = Path(tmp, f"req{gpu}.json")
        res = Path(tmp, f"res{gpu}.json")
        req.write_text(json.dumps({"shape": shape.to_dict(), "batch_sizes": chunk, "budget": budget, "seed": seed,
                                   "compile_workers": max(1, cores // len(chunks))}))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        proc = subprocess.Popen([sys.executable, "-m", "tuner.kernels.worker", str(req), str(res)], env=env,
                                stdout=subprocess.PIPE, text=True)
        thread = threading.Thread(target=_pump, args=(proc, progress), daemon=True)
        thread.start()
        procs.append((gpu, proc, thread, res))
    parts = []
    for gpu, proc, thread, res in procs:
        rc = proc.wait()
        thread.join()
        if rc != 0 or not res.exists():
            raise BackendUnavailableError(f"tuning worker on GPU {gpu} failed (exit code {rc})")
        parts.append(json.loads(res.read_text()))
    merged = {k: v for k, v in parts[0].items() if k not in ("results", "wall_s", "compile_wall_s")}
    merged["results"] = sorted((r for p in parts for r in p["results"]), key=lambda r: r["batch_size"])
    merged["wall_s"] = max(p["wall_s"] for p in parts)
    merged["compile_wall_s"] = max(p["compile_wall_s"] for p in parts)
    merged["gpus"] = gpu_ids
    return merged


def _pump(proc, progress):
    for line in proc.stdout:
        if progress:
            try:
                progress(json.loads(line))
            except json.JSONDecodeError:
                pass


def sglang_importable() -> bool:
    from tuner.kernels.sglang_env import installed_sglang

    return installed_sglang() is not None


SUMMARY_FILE = "summary.json"


def shape_reports(out_dir: Path) -> list[dict]:
    """The per-shape tune reports of a directory (``DIR/reports/*.json``; a summary there gives all
    of its shapes); unreadable files are skipped."""
    out = []
    for path in sorted((Path(out_dir) / "reports").glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict):
            out.extend(r for r in doc.get("reports", [doc]) if isinstance(r, dict) and "rows" in r)
    return out


def write_summary(out_dir: Path, *, last_call_wall_s: float | None = None) -> Path:
    """Rewrite ``DIR/summary.json`` from every shape's report in ``DIR/reports/`` (one entry per shape).

    The per-shape reports are the record (each call rewrites only its own shapes'), so the tune
    calls of several shapes, and a call cut short before it wrote the summary, share one directory
    and one summary without clobbering each other.
    """
    reports = [rep for rep in shape_reports(out_dir) if "kind" in rep and "tag" in rep]
    reports.sort(key=lambda r: (r["kind"] != "moe", r["tag"]))
    doc = {"impl": "sglang", "complete": bool(reports) and all(r.get("complete") for r in reports),
           "shapes": [r["tag"] for r in reports], "last_call_wall_s": last_call_wall_s, "reports": reports}
    path = out_dir / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(doc), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def run_sglang_tune(targets, batch_sizes: list[int], out_dir: Path, *, budget: int | None = None,
                    down_budget: int | None = None, routing: str = "sglang-tuner", grid: bool = False,
                    deadline_s: float | None = None, seed: int = 0, routed_pool: int | None = None,
                    shape_time_s: float | None = None) -> dict:
    """Tune every target with SGLang's own kernels; write the files and reports, and merge this
    call's shapes into OUT/summary.json. Returns this call's reports. ``shape_time_s``: each shape's
    device-time budget over all its calls (None: the evaluation budget alone)."""
    import time as _time

    _check_gpu()
    if not sglang_importable():
        raise BackendUnavailableError("sglang is not importable here; install it (or use --impl own)")
    from tuner.kernels.sglang_tune import tune_gemm, tune_moe

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = _time.monotonic()
    reports = []

    def left():
        return None if deadline_s is None else max(1.0, deadline_s - (_time.monotonic() - t0))

    def expired() -> bool:
        # a shape started after the deadline only pays its start-up (~50 s of compile workers
        # importing SGLang on the H200) before stopping at its first batch size
        return deadline_s is not None and _time.monotonic() - t0 >= deadline_s

    not_started: list[str] = []
    if targets.moe is not None:
        reports.append(tune_moe(targets.moe, batch_sizes, out_dir, budget=budget, down_budget=down_budget,
                                routing=routing, grid=grid, deadline_s=left(), seed=seed,
                                routed_pool=routed_pool, shape_time_s=shape_time_s))
    for g in targets.gemms:
        if reports and expired():
            not_started.append(g.tag)
            continue
        reports.append(tune_gemm(g, batch_sizes, out_dir, budget=budget, grid=grid, deadline_s=left(), seed=seed,
                                 shape_time_s=shape_time_s))
    wall = round(_time.monotonic() - t0, 1)
    doc = {"impl": "sglang", "wall_s": wall, "complete": all(r["complete"] for r in reports) and not not_started,
           "reports": reports, "not_started": not_started}
    doc["summary_file"] = str(write_summary(out_dir, last_call_wall_s=wall))
    return _finite(doc)


def reports_in(path: Path) -> list[dict]:
    """The tune reports of a file (a shape's report or a summary) or of a tune directory."""
    from tuner.errors import ConfigError

    path = Path(path)
    if path.is_dir():
        files = sorted((path / "reports").glob("*.json"))
        if not files and (path / SUMMARY_FILE).is_file():
            files = [path / SUMMARY_FILE]
        if not files:
            raise ConfigError(f"a tune directory holds reports/<shape>.json or {SUMMARY_FILE}; found neither",
                              file=str(path))
    else:
        files = [path]
    out = []
    for f in files:
        try:
            doc = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"not JSON ({exc})", file=str(f)) from None
        for rep in doc.get("reports", [doc]) if isinstance(doc, dict) else [None]:
            if not isinstance(rep, dict) or "rows" not in rep or "kind" not in rep:
                raise ConfigError("not a tune report (no kind/rows)", file=str(f))
            out.append(rep)
    return out


def summary_table(report: dict) -> list[str]:
    """One line per batch size: grid best, search, tuned, SGLang's shipped and default (us)."""
    def f(v):
        return "-" if v is None else f"{v:.1f}"

    moe = report["kind"] == "moe"
    head = (f"{'M':>6} {'default':>9} {'shipped':>9} {'grid':>9} {'search':>9} {'tuned':>9} {'chosen':>9} "
            f"{'vs base':>8} {'frac':>6} {'evals':>7} {'wall_s':>7}")
    lines = [f"{report['kind']} {report['tag']} ({report.get('device_name', '?')}, SGLang "
             f"{report.get('sglang_version', '?')}): {'complete' if report.get('complete') else 'INCOMPLETE'}", head]
    for r in report["rows"]:
        # the best of the search's re-timed leaders where the report has them (older reports: its pick)
        search = r.get("search_best_us") or (r.get("joint_us") if moe else r.get("found_us"))
        frac = r.get("search_fraction_of_grid_best") or (
            r.get("joint_fraction_of_grid_best") if moe else r.get("found_fraction_of_grid_best"))
        evals = (r.get("evaluations_joint", 0) + r.get("evaluations_down", 0)) if moe else r.get("evaluations", 0)
        sp = r.get("speedup_vs_baseline")
        lines.append(f"{r['batch_size']:>6} {f(r.get('default_us')):>9} {f(r.get('shipped_us')):>9} "
                     f"{f(r.get('grid_best_us')) + ('*' if r.get('grid_complete') is False else ''):>9} {f(search):>9} {f(r.get('tuned_us') if moe else None):>9} "
                     f"{r.get('chosen', '-'):>9} {('-' if sp is None else f'{sp:.2f}x'):>8} "
                     f"{('-' if frac is None else f'{frac:.3f}'):>6} {evals:>7} {f(r.get('wall_s')):>7}")
    if any(r.get("grid_complete") is False for r in report["rows"]):
        lines.append("* the grid was cut off at this batch size: best of the configs it reached")
    lines.append(f"files: {', '.join(report.get('files') or []) or 'none'}; this call {report.get('this_call_wall_s')} s "
                 f"(compile {report.get('this_call_compile_wall_s')} s)")
    return lines
