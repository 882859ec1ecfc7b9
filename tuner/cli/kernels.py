"""``tuner kernels``: fused-MoE Triton tile configs (shape on CPU; tuning on a GPU)."""

from __future__ import annotations

from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option


@click.group()
def kernels():
    """Tune fused-MoE Triton kernel tile configs and write SGLang's config files."""


def _shape_options(fn):
    fn = click.option("--disable-shared-experts-fusion", is_flag=True,
                      help="Do not count the shared expert among E (SGLang's flag of that name).")(fn)
    fn = click.option("--block-shape", default=None,
                      help="fp8 block-wise weight quantisation block_n,block_k (e.g. 128,128).")(fn)
    fn = click.option("--dtype", type=click.Choice(["bf16", "fp8_w8a8"]), default="bf16", show_default=True)(fn)
    fn = click.option("--ep-size", type=int, default=1, show_default=True, help="Expert-parallel size.")(fn)
    fn = click.option("--tp-size", type=int, required=True, help="Tensor-parallel size.")(fn)
    fn = click.option("--model", required=True, help="Catalog model name, e.g. glm-5.1.")(fn)
    return fn


def _shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion):
    from tuner.kernels.shapes import moe_shape, parse_block_shape

    return moe_shape(model, tp_size, ep_size, dtype, parse_block_shape(block_shape), disable_shared_experts_fusion)


@kernels.command("shape")
@_shape_options
@json_option
def shape_cmd(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion, as_json):
    """Print the expert shape (E, N, K) and the config file name for a model and parallelism."""
    from tuner.kernels.configfile import moe_config_filename
    from tuner.kernels.space import feasible_space, search_space_for
    from tuner.kernels.tune import default_budget

    s = _shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion)
    doc = {**s.to_dict(), "grid_size": len(search_space_for(s.dtype, s.block_shape)),
           "feasible_on_hopper": len(feasible_space(s.dtype, s.block_shape, 232_448)),
           "default_budget": default_budget(s),
           "config_file_h200": moe_config_filename(s.num_experts, s.intermediate, "NVIDIA H200", s.config_dtype,
                                                   s.block_shape)}
    if as_json:
        emit_json(doc)
        return
    for k, v in doc.items():
        click.echo(f"{k}: {v}")


@kernels.command("tune")
@_shape_options
@click.option("--batch-sizes", default=None, help="Comma-separated token counts (default: SGLang's 18, 1..4096).")
@click.option("--budget", type=int, default=None, help="Timed configs per batch size (default: 10% of the grid, <= 192).")
@click.option("--gpu-ids", default="0", show_default=True, help="GPUs to spread batch sizes over, e.g. 0,1,2,3.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory; the file goes to DIR/configs/triton_X_Y_Z/ (use it as SGLANG_MOE_CONFIG_DIR).")
@json_option
def tune_cmd(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion, batch_sizes, budget,
             gpu_ids, seed, out_dir, as_json):
    """Search tile configs per batch size on this machine's GPUs and write SGLang's JSON config file."""
    from tuner.errors import ConfigError
    from tuner.kernels.tune import DEFAULT_BATCH_SIZES, default_budget, parse_int_list, run_tune

    s = _shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion)
    sizes = parse_int_list(batch_sizes, "batch_sizes") if batch_sizes else list(DEFAULT_BATCH_SIZES)
    if any(m <= 0 for m in sizes):
        raise ConfigError("batch sizes must be positive", key="batch_sizes")
    if budget is not None and budget < 1:
        raise ConfigError("budget must be >= 1", key="budget")
    budget = budget or default_budget(s)
    gpus = parse_int_list(gpu_ids, "gpu_ids")
    from tuner.kernels.tune import _check_gpu

    _check_gpu()  # fail before any progress bar is drawn

    if as_json:
        doc = run_tune(s, sizes, budget, gpus, out_dir, seed=seed)
        emit_json(doc)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        evals = bar.add_task("configs timed", total=budget * len(sizes))
        done = bar.add_task("batch sizes", total=len(sizes))

        def progress(event):
            if event.get("event") == "eval":
                bar.advance(evals, event.get("n", 1))
            elif event.get("event") == "done":
                bar.advance(done)

        doc = run_tune(s, sizes, budget, gpus, out_dir, seed=seed, progress=progress)
    click.echo(f"{doc['device_name']}, triton {doc['triton_version']}: wrote {doc['config_file']}")
    click.echo(f"{'M':>6} {'tuned_us':>10} {'default_us':>11} {'speedup':>8} {'evals':>6}  config")
    for r in doc["results"]:
        d, t = r["default_us"], r["best_us"]
        speed = f"{d / t:.2f}x" if d and t else "-"
        cfg = r["config"]
        click.echo(f"{r['batch_size']:>6} {t:>10.1f} {d if d is None else round(d, 1)!s:>11} {speed:>8} "
                   f"{r['evaluations']:>6}  {cfg}")
    click.echo(f"wall {doc['wall_s']:.0f} s (compile {doc['compile_wall_s']:.0f} s)")
