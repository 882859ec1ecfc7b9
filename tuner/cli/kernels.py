"""``tuner kernels``: fused-MoE Triton tile configs (shape on CPU; tuning on a GPU)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option


@click.group()
def kernels():
    """Tile configs for SGLang's fused-MoE and fp8 block-GEMM kernels: tune them on a GPU and write the
    files SGLang reads, time them against SGLang's, and check that a server loaded them."""


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


ROUTINGS = ("sglang-tuner", "serving", "collapsed")
_ROUTING_HELP = ("Expert routing of the timed calls: SGLang's tuner's (random top-k over every expert slot), the "
                 "server's (fused shared expert always chosen), or collapsed (the server's, with every token's "
                 "routed top-k drawn from the same few experts: how a biased gate such as DeepSeek-V3's routes "
                 "under --load-format dummy).")
_POOL_HELP = ("Routed experts a collapsed routing spreads tokens over (default: top-k plus the near-ties measured "
              "on DeepSeek-V3 with random weights).")


def _routed_pool(shape, routing: str, routed_pool: int | None) -> int | None:
    """The collapsed routing's pool of routed experts (None for the other routings)."""
    from tuner.errors import ConfigError
    from tuner.catalog.routing import COLLAPSED_GATE_EXTRA_EXPERTS

    if routing != "collapsed":
        if routed_pool is not None:
            raise ConfigError("--routed-pool applies only to --routing collapsed", key="routed_pool")
        return None
    pool = routed_pool or min(shape.routed_experts, shape.routed_topk + COLLAPSED_GATE_EXTRA_EXPERTS)
    if not shape.routed_topk <= pool <= shape.routed_experts:
        raise ConfigError(f"--routed-pool must be between top-k {shape.routed_topk} and the {shape.routed_experts} "
                          f"routed experts, got {pool}", key="routed_pool")
    return pool


@kernels.command("shape")
@_shape_options
@json_option
def shape_cmd(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion, as_json):
    """Print the expert shape (E, N, K) and the config file name for a model and parallelism."""
    from tuner.kernels.configfile import moe_config_filename
    from tuner.kernels.space import feasible_space, search_space_for
    from tuner.kernels.tune import default_budget

    from tuner.kernels.gemm_shapes import linear_layers
    from tuner.kernels.sglang_layout import LAYOUTS, MOE_CONFIG_DIR_ENV, gemm_config_filename

    s = _shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion)
    doc = {**s.to_dict(), "grid_size": len(search_space_for(s.dtype, s.block_shape)),
           "feasible_on_hopper": len(feasible_space(s.dtype, s.block_shape, 232_448)),
           "default_budget": default_budget(s),
           "config_file_h200": moe_config_filename(s.num_experts, s.intermediate, "NVIDIA H200", s.config_dtype,
                                                   s.block_shape),
           "down_file_h200": moe_config_filename(s.num_experts, s.intermediate, "NVIDIA H200", s.config_dtype,
                                                 s.block_shape, down=True),
           "moe_files_read_from": f"${MOE_CONFIG_DIR_ENV}/configs/triton_<X_Y_Z>/"}
    if s.dtype == "fp8_w8a8" and s.block_shape:
        doc["gemm_files_h200"] = {layer.name: gemm_config_filename(layer.shape.N, layer.shape.K, "NVIDIA H200",
                                                                   layer.shape.block_shape)
                                  for layer in linear_layers(model, tp_size,
                                                             disable_shared_experts_fusion=disable_shared_experts_fusion,
                                                             block_shape=s.block_shape)}
        doc["gemm_files_read_from"] = {v: "sglang/" + lay.gemm_config_subdir + "/" for v, lay in LAYOUTS.items()}
    if as_json:
        emit_json(doc)
        return
    for k, v in doc.items():
        click.echo(f"{k}: {v}")


@kernels.command("tune")
@_shape_options
@click.option("--kernel", "kernel_kind", type=click.Choice(["all", "moe", "gemm"]), default="all", show_default=True,
              help="What to tune: the fused MoE, the block-fp8 GEMMs of the model's linear layers, or both "
                   "(GEMMs only with --dtype fp8_w8a8 --block-shape 128,128).")
@click.option("--impl", type=click.Choice(["auto", "sglang", "own"]), default="auto", show_default=True,
              help="Time SGLang's own kernels (auto: when sglang is importable) or our look-alike MoE kernel.")
@click.option("--attn-tp-size", type=int, default=None, help="Attention TP size for the GEMM shapes (default: --tp-size).")
@click.option("--gemm-shape", "gemm_shapes", multiple=True, help="Only these GEMMs, as N,K (repeatable).")
@click.option("--batch-sizes", default=None, help="Comma-separated token counts (default: SGLang's 18, 1..4096).")
@click.option("--budget", type=int, default=None,
              help="Timed configs per batch size (default: 10% of SGLang's grid for the kernel).")
@click.option("--down-budget", type=int, default=None,
              help="Timed down-projection configs per batch size (SGLang, MoE; default 10% of that space; 0: no _down file).")
@click.option("--routing", type=click.Choice(ROUTINGS), default="sglang-tuner", show_default=True, help=_ROUTING_HELP)
@click.option("--routed-pool", type=int, default=None, help=_POOL_HELP)
@click.option("--grid", is_flag=True, help="Also time SGLang's exhaustive grid at every batch size (benchmark).")
@click.option("--deadline-s", type=float, default=None,
              help="Stop starting new batch sizes after this many seconds; rerun the same command to continue.")
@click.option("--shape-time-s", type=float, default=900.0, show_default=True,
              help="Device time one shape may take over all its calls (SGLang's kernels): what is left is shared "
                   "over the batch sizes still to tune, and each search stops at its share after its warm start. "
                   "0: no time limit (the evaluation budget alone). Not applied with --grid.")
@click.option("--gpu-ids", default="0", show_default=True, help="GPUs to spread batch sizes over (own kernel only).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Directory: MoE files go to DIR/configs/triton_X_Y_Z/ (SGLANG_MOE_CONFIG_DIR=DIR), GEMM files "
                   "to DIR/gemm_configs/, each shape's report to DIR/reports/<shape>.json, finished batch "
                   "sizes to DIR/state/ (a rerun continues), and every shape's report, merged, to "
                   "DIR/summary.json. Calls for other shapes may share DIR.")
@json_option
def tune_cmd(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion, kernel_kind, impl,
             attn_tp_size, gemm_shapes, batch_sizes, budget, down_budget, routing, routed_pool, grid, deadline_s,
             shape_time_s, gpu_ids, seed, out_dir, as_json):
    """Tune tile configs per batch size on this machine's GPU and write the files SGLang reads.

    With SGLang importable, the timed call is SGLang's own: the whole fused_experts call as its MoE
    runner makes it (align, both GEMMs, activation, top-k sum), with a separate down-projection
    config for the _down file, and w8a8_block_fp8_matmul for fp8 block GEMMs. Each batch size
    reports SGLang's default, its shipped file (when the installed package has one for this shape),
    the search's pick and the tuned pair; the fastest goes into the file.
    """
    from tuner.errors import ConfigError
    from tuner.kernels.shapes import parse_block_shape
    from tuner.kernels.targets import (SGLANG_BATCH_SIZES, check_batch_sizes, check_output_dir,
                                       parse_gemm_shape, tune_targets)
    from tuner.kernels.tune import default_budget, parse_int_list, run_sglang_tune, run_tune, sglang_importable

    targets = tune_targets(model, tp_size, ep_size, dtype, parse_block_shape(block_shape), kernel=kernel_kind,
                           disable_shared_experts_fusion=disable_shared_experts_fusion, attn_tp_size=attn_tp_size,
                           only_gemm_shapes=[parse_gemm_shape(g) for g in gemm_shapes] or None)
    sizes = check_batch_sizes(parse_int_list(batch_sizes, "batch_sizes") if batch_sizes else list(SGLANG_BATCH_SIZES))
    if budget is not None and budget < 1:
        raise ConfigError(f"budget must be >= 1, got {budget}", key="budget")
    if down_budget is not None and down_budget < 0:
        raise ConfigError(f"down budget must be >= 0, got {down_budget}", key="down_budget")
    if deadline_s is not None and deadline_s <= 0:
        raise ConfigError(f"deadline must be positive seconds, got {deadline_s}", key="deadline_s")
    if shape_time_s < 0:
        raise ConfigError(f"shape time must be >= 0 seconds (0: no limit), got {shape_time_s}", key="shape_time_s")
    routed_pool = _routed_pool(targets.moe, routing, routed_pool) if targets.moe is not None else None
    out_dir = check_output_dir(out_dir)
    use_sglang = impl == "sglang" or (impl == "auto" and sglang_importable())
    if not use_sglang and routing == "collapsed":
        raise ConfigError("--routing collapsed times SGLang's own kernel; sglang is not importable here "
                          "(or --impl own was given)", key="routing")
    if not use_sglang:
        if targets.moe is None:
            raise ConfigError("the block-fp8 GEMM can only be tuned with SGLang's own kernel (sglang is not "
                              "importable here)", key="impl")
        if targets.gemms:
            click.echo(f"sglang is not importable: skipping the {len(targets.gemms)} block-fp8 GEMM shape(s)", err=True)
        if grid:
            raise ConfigError("--grid with our own kernel is `tuner kernels benchmark`", key="grid")
        if impl == "auto":
            click.echo("sglang is not importable here: timing our own look-alike fused-MoE kernel "
                       "(its tiles are a stand-in for SGLang's)", err=True)
        from tuner.kernels.tune import _check_gpu

        _check_gpu()
        s = targets.moe
        doc = run_tune(s, sizes, budget or default_budget(s), parse_int_list(gpu_ids, "gpu_ids"), out_dir, seed=seed)
        if as_json:
            emit_json(doc)
            return
        click.echo(f"{doc['device_name']}, triton {doc['triton_version']}: wrote {doc['config_file']}")
        click.echo(f"{'M':>6} {'tuned_us':>10} {'default_us':>11} {'speedup':>8} {'evals':>6}  config")
        for r in doc["results"]:
            d, t = r["default_us"], r["best_us"]
            speed = f"{d / t:.2f}x" if d and t else "-"
            click.echo(f"{r['batch_size']:>6} {t:>10.1f} {d if d is None else round(d, 1)!s:>11} {speed:>8} "
                       f"{r['evaluations']:>6}  {r['config']}")
        click.echo(f"wall {doc['wall_s']:.0f} s (compile {doc['compile_wall_s']:.0f} s)")
        return
    for line in targets.describe():
        click.echo(f"tuning {line}", err=True)
    doc = run_sglang_tune(targets, sizes, out_dir, budget=budget, down_budget=down_budget, routing=routing,
                          grid=grid, deadline_s=deadline_s, seed=seed, routed_pool=routed_pool,
                          shape_time_s=shape_time_s or None)
    if as_json:
        emit_json(doc)
        return
    from tuner.kernels.tune import summary_table

    for rep in doc["reports"]:
        for line in summary_table(rep):
            click.echo(line)
    if doc.get("not_started"):
        click.echo(f"not started (deadline reached): {', '.join(doc['not_started'])}")
    click.echo(f"{'complete' if doc['complete'] else 'INCOMPLETE (rerun to continue)'}; wall {doc['wall_s']} s; "
               f"{doc['summary_file']}")


@kernels.command("compare")
@_shape_options
@click.option("--configs", "config_dir", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A tuned directory laid out as SGLANG_MOE_CONFIG_DIR (DIR/configs/triton_X_Y_Z/): its file "
                   "for this shape, and its _down twin, are timed against SGLang's default.")
@click.option("--routing", type=click.Choice(ROUTINGS), default="serving", show_default=True, help=_ROUTING_HELP)
@click.option("--routed-pool", type=int, default=None, help=_POOL_HELP)
@click.option("--batch-sizes", default="16,64,128,256,512,1024", show_default=True,
              help="Comma-separated token counts per call.")
@click.option("--rounds", type=int, default=5, show_default=True,
              help="Interleaved timing rounds (each times every candidate once; the median is kept).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--as-served", is_flag=True,
              help="Time the copy a trial serves instead of DIR's files as they are: merged over the installed "
                   "SGLang's shipped file, or filled with its default config at the batch sizes no tuned key "
                   "covers (docs/kernels.md, 'Partial files').")
@click.option("-o", "--output", "out_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the result as JSON here.")
@json_option
def compare_cmd(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion, config_dir, routing,
                routed_pool, batch_sizes, rounds, seed, as_served, out_file, as_json):
    """Time SGLang's fused-MoE call with a tuned directory's files against SGLang's own choice.

    Per batch size, the entries SGLang would read from DIR's file (nearest batch size, and its
    _down twin), SGLang's get_default_config answer and, where the installed SGLang ships a file
    for the shape, that file's entries, timed in interleaved rounds on this machine's GPU. Shows
    whether tiles tuned under one routing still win under another (GPU and SGLang only).
    """
    import json
    import tempfile

    from tuner.errors import BackendUnavailableError, ConfigError
    from tuner.kernels.targets import check_batch_sizes
    from tuner.kernels.tune import _check_gpu, parse_int_list, sglang_importable
    from tuner.safewrite import check_target, write_text

    s = _shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion)
    sizes = check_batch_sizes(parse_int_list(batch_sizes, "batch_sizes"))
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {rounds}", key="rounds")
    routed_pool = _routed_pool(s, routing, routed_pool)
    if out_file is not None:
        out_file = check_target(out_file)
    _check_gpu()
    if not sglang_importable():
        raise BackendUnavailableError("comparing configs times SGLang's own kernel; sglang is not importable here")
    from tuner.kernels.sglang_compare import compare_moe, compare_table

    def run(timed_dir: Path) -> dict:
        return compare_moe(s, sizes, timed_dir, routing=routing, routed_pool=routed_pool, rounds=rounds, seed=seed,
                           log=lambda m: click.echo(m, err=True))

    if not as_served:
        doc = run(config_dir)
    else:
        from tuner.backends.moe_configs import build_trial_moe_dir

        with tempfile.TemporaryDirectory(prefix="tuner-served-") as tmp:
            served_dir, _, filled = build_trial_moe_dir(Path(tmp), config_dir, include_shipped=False,
                                                        merge_shipped=True)
            doc = run(served_dir)
        # the served copy is gone once timed: name the files by where they were built from
        doc["config_dir"] = str(config_dir)
        for key in ("up", "down_path"):
            if doc["files"].get(key):
                doc["files"][key] = str(config_dir / Path(doc["files"][key]).relative_to(served_dir))
        doc.update(as_served=True, keys_from_sglang=filled)
    if out_file is not None:
        write_text(out_file, json.dumps(doc, indent=1) + "\n")
    if as_json:
        emit_json(doc)
        return
    for line in compare_table(doc):
        click.echo(line)


@kernels.command("table")
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def table_cmd(reports):
    """Print the per-batch-size tables of tune reports.

    Each argument is a tune directory (`tuner kernels tune -o DIR`: every shape's DIR/reports/*.json),
    a shape's report or a summary.json.
    """
    from tuner.kernels.tune import reports_in, summary_table

    for path in reports:
        for rep in reports_in(path):
            for line in summary_table(rep):
                click.echo(line)


@kernels.command("convergence")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--shape-time-s", type=float, default=None,
              help="Instead: what a `tune --shape-time-s` budget would have kept of each recorded search (each "
                   "batch size's share at the rate its evaluations ran, the best of that many first evaluations "
                   "against the whole search's best; an estimate).")
@json_option
def convergence_cmd(directory, shape_time_s, as_json):
    """How many evaluations each tile search needed, from a tuned DIR's recorded timings (CPU).

    Replays every search of DIR/reports/*.timings.jsonl in its evaluation order: the evaluations to
    come within 2%, 1% and 0% of its own best (and of the grid's best, where `--grid` ran), and the
    best found within the first 25/50/75% of its budget. The evidence for a smaller --budget.
    """
    from tuner.errors import ConfigError
    from tuner.kernels.convergence import convergence, time_budget_replay

    if shape_time_s is not None:
        if shape_time_s <= 0:
            raise ConfigError(f"shape time must be positive seconds, got {shape_time_s}", key="shape_time_s")
        doc = time_budget_replay(directory, shape_time_s)
        if as_json:
            emit_json(doc)
            return
        click.echo(f"{'shape':<36}{'M':>6}{'full s':>8}{'share s':>8}  {'joint evals':>12}{'reach':>7}"
                   f"  {'down evals':>11}{'reach':>7}")
        for r in doc["rows"]:
            ev, at, best = r["evaluations_full"], r["evaluations_at_budget"], r["best_at_budget"]
            cell = lambda k: (f"{at[k]:>5}/{ev[k]:<6}", f"{best[k]:>7.3f}" if best.get(k) else f"{'-':>7}") \
                if k in ev else (f"{'-':>12}", f"{'-':>7}")
            (je, jr), (de, dr) = cell("joint"), cell("down")
            click.echo(f"{r['shape']:<36}{r['batch_size']:>6}{r['full_wall_s']:>8.0f}{r['share_s']:>8.0f}  {je:>12}{jr}"
                       f"  {de:>11}{dr}")
        for tag, sh in doc["shapes"].items():
            click.echo(f"{tag}: {sh['batch_sizes']} batch sizes took {sh['full_wall_s']:.0f} s with the whole "
                       f"evaluation budget; budget {shape_time_s:.0f} s")
        worst = doc["joint_worst_best_at_budget"]
        click.echo("reach: the best of the evaluations the share pays for over the whole search's best (1.000: "
                   f"nothing lost); worst joint {worst:.3f}" if worst else "no search to replay")
        return
    doc = convergence(directory)
    if as_json:
        emit_json(doc)
        return
    click.echo(f"{'shape':<36}{'M':>6} {'search':<6}{'evals':>6}{'best us':>10}{'to 2%':>7}{'to 1%':>7}{'to 0%':>7}"
               f"{'@25%':>8}{'@50%':>8}{'@75%':>8}{'grid/best':>10}")
    fmt = lambda v: "-" if v is None else str(v)
    for t in doc["searches"]:
        w, a = t["evals_to_within"], t["best_so_far_at_share"]
        grid = "-" if t["fraction_of_grid_best"] is None else f"{t['fraction_of_grid_best']:.3f}"
        click.echo(f"{t['shape']:<36}{t['batch_size']:>6} {t['search']:<6}{t['evaluations']:>6}{t['best_us']:>10.1f}"
                   f"{fmt(w['2%']):>7}{fmt(w['1%']):>7}{fmt(w['0%']):>7}"
                   f"{a['25%']:>8.3f}{a['50%']:>8.3f}{a['75%']:>8.3f}{grid:>10}")
    worst = doc["joint_worst_best_so_far_at_share"]
    click.echo("joint searches, worst best-so-far against their own best: "
               + ", ".join(f"{k} of the budget {v:.3f}x" for k, v in worst.items() if v is not None)
               + f"; within 2% after at most {doc['joint_max_share_of_budget_to_within_2pct']:.0%} of the budget")


@kernels.command("benchmark")
@_shape_options
@click.option("--batch-sizes", default="1,16,64,256,1024,4096", show_default=True)
@click.option("--budget", type=int, default=None, help="Search evaluations per batch size (default 10% of the grid).")
@click.option("--no-grid", is_flag=True, help="Search only.")
@click.option("--grid-only", is_flag=True, help="Complete the grid at these batch sizes against --found-from's picks.")
@click.option("--found-from", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="summary.json holding the search's picks (with --grid-only).")
@click.option("--deadline-s", type=float, default=None, help="Stop grid timing after this many seconds.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(path_type=Path))
def benchmark_cmd(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion, batch_sizes, budget,
                  no_grid, grid_only, found_from, deadline_s, seed, out_dir):
    """Search vs exhaustive grid vs SGLang's default on our own look-alike kernel (GPU).

    For SGLang's own kernels the same comparison is `tuner kernels tune --grid`.
    """
    import json
    import time

    from tuner.errors import ConfigError
    from tuner.kernels import benchmark as bm
    from tuner.kernels.targets import check_batch_sizes, check_output_dir
    from tuner.kernels.tune import _check_gpu, default_budget, parse_int_list

    shape = _shape(model, tp_size, ep_size, dtype, block_shape, disable_shared_experts_fusion)
    sizes = check_batch_sizes(parse_int_list(batch_sizes, "batch_sizes"))
    if grid_only and found_from is None:
        raise ConfigError("--grid-only needs --found-from", key="found_from")
    out_dir = check_output_dir(out_dir)
    _check_gpu()
    out_dir.mkdir(parents=True, exist_ok=True)
    if grid_only:
        deadline = time.monotonic() + deadline_s if deadline_s else None
        res = bm.run_grid_only(shape, sizes, bm.found_configs_from(found_from, shape), out_dir, seed=seed,
                               deadline=deadline)
        for line in bm.grid_only_table(res):
            click.echo(line)
        return
    res = bm.run_shape(shape, sizes, budget or default_budget(shape), out_dir, seed=seed, grid=not no_grid)
    res["model"], res["tp_size"], res["ep_size"] = model, tp_size, ep_size
    name = f"summary_{model}_tp{tp_size}_ep{ep_size}_{dtype}.json"
    (out_dir / name).write_text(json.dumps(res, indent=2) + "\n")
    for line in bm.shape_table(res):
        click.echo(line)


@kernels.command("summarize")
@click.option("--update-from", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A benchmark --grid-only result: fold its complete batch sizes into -o in place.")
@click.option("--grid", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--search-log", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None)
@click.option("--shape-json", default=None, help="JSON: {model, tp_size, ep_size, shape: {...}, grid_size}.")
@click.option("--extra", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Benchmark summaries of further shapes (repeatable).")
@click.option("--device-name", default="NVIDIA H200", show_default=True)
@click.option("--triton-version", default="3.6.0", show_default=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
def summarize_cmd(update_from, grid, search_log, shape_json, extra, device_name, triton_version, output):
    """Build the committed summary.json from an own-kernel benchmark run's raw files (CPU)."""
    from tuner.kernels import summarize as sm

    click.echo(sm.run(update_from=update_from, grid=grid, search_log=search_log, shape_json=shape_json,
                      extra=list(extra), device_name=device_name, triton_version=triton_version, output=output))


@kernels.command("ledger")
@click.option("--cache-dir", type=click.Path(path_type=Path), default=None,
              help="The pinned Triton cache to read (default: TRITON_CACHE_DIR, else ~/.triton/cache, as tuner pins it).")
@json_option
def ledger_cmd(cache_dir, as_json):
    """What a machine's pinned Triton cache holds, per kernel set: the prefill batch sizes and CUDA-graph
    sizes its SGLang servers ran there (tuner records them after each load point). A trial's first load
    point is predicted with those kernels built. Remove the cache directory to start cold."""
    from tuner.errors import ConfigError
    from tuner.backends.sglang import pinned_triton_cache
    from tuner.evaluation.kernel_ledger import LEDGER_FILE, KernelLedger

    # the directory a server started here is pinned to (this process's TRITON_CACHE_DIR where set)
    cache_dir = cache_dir or Path(pinned_triton_cache({}).get("TRITON_CACHE_DIR") or os.environ["TRITON_CACHE_DIR"])
    if cache_dir.exists() and not cache_dir.is_dir():
        raise ConfigError("not a directory: give the Triton cache directory, not a file in it", file=str(cache_dir))
    sets = KernelLedger(cache_dir).sets() if cache_dir.is_dir() else {}
    rows = [{"kernel_set": key, "gpu": (e.get("parts") or {}).get("gpu"),
             "sglang_version": (e.get("parts") or {}).get("sglang_version"),
             "flags": (e.get("parts") or {}).get("flags") or {},
             "prefill_sizes": len(e.get("prefill_tokens") or []), "graph_sizes": len(e.get("graph_tokens") or []),
             "largest_prefill": max(e.get("prefill_tokens") or [0]), "updated": e.get("updated")}
            for key, e in sorted(sets.items(), key=lambda kv: str(kv[1].get("updated")))]
    if as_json:
        emit_json({"cache_dir": str(cache_dir), "ledger": str(cache_dir / LEDGER_FILE), "sets": rows})
        return
    if not rows:
        click.echo(f"no kernel ledger in {cache_dir}: tuner writes {LEDGER_FILE} there once SGLang servers "
                   "with the cache pinned have served a load point")
        return
    click.echo(f"{cache_dir / LEDGER_FILE}: {len(rows)} kernel set(s)")
    for r in rows:
        flags = ", ".join(f"{k}={v}" for k, v in r["flags"].items()) or "SGLang's defaults"
        click.echo(f"  {r['kernel_set']}  {r['gpu']}  SGLang {r['sglang_version']}  {flags}\n"
                   f"      {r['prefill_sizes']} prefill sizes (up to {r['largest_prefill']:,} tokens), "
                   f"{r['graph_sizes']} graph sizes; last extended {r['updated']}")


@kernels.command("prove-log")
@click.argument("log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tuned-dir", "tuned_dirs", multiple=True, required=True, type=click.Path(path_type=Path),
              help="Directory the server read our files from (SGLANG_MOE_CONFIG_DIR, the GEMM overlay); repeatable.")
@click.option("--expect", "expected", multiple=True, required=True,
              help="A tile file name the server must have loaded from there (repeatable).")
@json_option
def prove_log_cmd(log, tuned_dirs, expected, as_json):
    """Check a server log: SGLang loaded every expected file from our directory, with no default-config
    or fallback warning left for them. Exit 0 if proven, 1 if not."""
    from tuner.kernels.logproof import prove_loaded

    proof = prove_loaded(log, list(expected), list(tuned_dirs))
    if as_json:
        emit_json({"loaded": proof.loaded, "expected": proof.expected, "loaded_ours": proof.loaded_ours,
                   "missing": proof.missing, "warnings": [w.__dict__ for w in proof.warnings],
                   "other_warnings": [w.__dict__ for w in proof.other_warnings], "summary": proof.summary()})
    else:
        click.echo(proof.summary())
    raise SystemExit(0 if proof.loaded else 1)


@kernels.command("decode-steps")
@click.argument("a_log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("b_log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
def decode_steps_cmd(a_log, b_log, as_json):
    """Two SGLang server logs (plain or .gz) side by side: B's pure-decode step over A's at equal
    batch and context (windows of 40 decode batches with no prefill batch; step = c[server, batch] +
    k x #token fitted over both), with a 90% interval from resampling the windows. Run it on the
    default and tuned servers of a tile A/B to see what the decode kernels did with the traffic
    taken out. Exit 1 when the logs share no batch size."""
    from tuner.sim.decode_ab import compare_server_logs

    c = compare_server_logs(a_log, b_log)
    if as_json:
        emit_json(c.to_dict())
    else:
        for b in c.batches:
            click.echo(f"batch {b.batch:4d}: A {b.a_step_ms:7.2f} ms ({b.a_windows} windows, {b.a_kv_tokens:9.0f} tokens)"
                       f"  B {b.b_step_ms:7.2f} ms ({b.b_windows} windows, {b.b_kv_tokens:9.0f} tokens)")
        click.echo(c.summary())
    raise SystemExit(0 if c.ratio is not None else 1)


@kernels.command("refit-serving")
@click.option("--default", "default_points", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Load points served with SGLang's shipped/default tiles (JSON list or JSONL of load points).")
@click.option("--tuned", "tuned_points", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Load points of the same workload and user counts with tuned tiles.")
@click.option("--logs", "log_pairs", nargs=2, multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="DEFAULT_LOG TUNED_LOG",
              help="Instead of load points: the two servers' own SGLang logs (repeatable, one pair per A/B). "
                   "Their pure-decode steps at equal batch and context (`tuner kernels decode-steps`) are "
                   "compared with the saving the tuned kernels predict at each batch; needs --kernel-report.")
@click.option("--gpu", required=True, help="Catalog GPU name: writes tuner/sim/calibration/<gpu>.yaml.")
@click.option("--model", default=None,
              help="The served model (with --kernel-report): a catalog name, or a directory holding its "
                   "config.json. A study with model overrides (fewer layers) needs the directory: a tile A/B "
                   "run folder's model/ (the kernels' layer counts come from it).")
@click.option("--kernel-report", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A tune summary (OUT/summary.json) or one shape's OUT/reports/<shape>.json: the step change "
                   "is shared out over the model's tuned kernels (fused MoE, block-fp8 GEMMs) by what each saves.")
@click.option("--tp-size", type=int, default=1, show_default=True, help="The served TP size (the kernels' shapes).")
@click.option("--dtype", type=click.Choice(["bf16", "fp8_w8a8"]), default=None,
              help="The served weights (default: the one the report holds for the model).")
@click.option("--accept-realisation", is_flag=True,
              help="Write the fit even when serving showed far more or less than the kernels' saving "
                   "(realisation outside 0.5-1.5).")
@click.option("--decode-padding", is_flag=True,
              help="With --kernel-report: time the decode kernels at the batches SGLang's CUDA graphs run (a "
                   "binomial batch of the load point's users, padded up to the next captured size: 9 runs as 12) "
                   "instead of at the mean decode batch.")
@click.option("--dry-run", is_flag=True, help="Print the fit, write nothing.")
@json_option
def refit_serving_cmd(default_points, tuned_points, log_pairs, gpu, model, kernel_report, tp_size, dtype,
                      accept_realisation, decode_padding, dry_run, as_json):
    """Refit the simulator's tile speedups from a measured serving difference (default vs tuned).

    Without --kernel-report the whole step change is put on the fused MoE. With it, each kernel gets
    the share of the change that its measured saving predicts, at the decode batch and at the prefill
    passes of each load point; the realisation (measured over predicted) scales every tuned batch
    size's speedup, written to moe_tuned_speedup and gemm_tuned_speedup.

    With --logs the measurement is the servers' pure-decode steps instead of whole TPOTs: the window's
    traffic (which prefills landed between tokens) is taken out. Where the realisation's 90% interval
    holds 1 the kernel timings already explain the servers, and nothing is written."""
    from tuner.catalog import get_gpu
    from tuner.errors import ConfigError
    from tuner.sim import serving_refit as sr

    get_gpu(gpu)
    if log_pairs and (default_points or tuned_points):
        raise ConfigError("give either --default/--tuned load points or --logs pairs, not both", key="logs")
    if not log_pairs and not (default_points and tuned_points):
        raise ConfigError("give --default and --tuned load points, or --logs DEFAULT_LOG TUNED_LOG", key="default")
    if log_pairs:
        _refit_from_decode_steps(sr, log_pairs, gpu, model, kernel_report, tp_size, dtype, accept_realisation,
                                 dry_run, as_json)
        return
    terms = None
    if kernel_report is not None:
        if model is None:
            raise ConfigError("--kernel-report needs --model (the served model: its kernels and layer counts)",
                              key="model")
        terms = _terms_for(sr, kernel_report, model, tp_size, dtype)
    if decode_padding and terms is None:
        raise ConfigError("--decode-padding needs --kernel-report (the kernels' times by batch size)",
                          key="decode_padding")
    pairs = sr.serving_pairs(sr.load_points(default_points), sr.load_points(tuned_points), terms=terms,
                             decode_padding=decode_padding)
    a = sr.realisation(pairs) if terms else None
    refused = bool(terms) and not sr.realisation_plausible(a) and not accept_realisation
    path = None
    if not dry_run and not refused:
        path = sr.write_gpu_calibration(gpu, pairs, f"{default_points} vs {tuned_points}", terms=terms)
    fitted = sr.attributed_speedups(terms, a) if terms and a is not None else {}
    if as_json:
        emit_json({"pairs": [p.__dict__ for p in pairs], "realisation": a,
                   "kernels": [{"kind": t.kind.value, "tag": t.tag, "calls": t.calls} for t in terms or []],
                   "speedups": fitted, "written": str(path) if path else None,
                   "refused": refused and not dry_run})
        raise SystemExit(1 if refused and not dry_run else 0)
    click.echo(f"{'users':>6} {'decode_tok':>10} {'tpot_def_ms':>11} {'tpot_tun_ms':>11} {'step':>6} {'moe_f':>6} "
               f"{'moe_x':>6} {'pred_S':>7} {'real':>6}")
    for p in pairs:
        pred = f"{p.predicted_saved_fraction:>7.4f}" if p.predicted_saved_fraction is not None else f"{'-':>7}"
        real = f"{p.realisation:>6.2f}" if p.realisation is not None else f"{'-':>6}"
        click.echo(f"{p.users:>6} {p.decode_tokens:>10.1f} {p.tpot_default_s * 1e3:>11.2f} {p.tpot_tuned_s * 1e3:>11.2f} "
                   f"{p.step_ratio:>6.3f} {p.moe_share:>6.2f} {p.moe_speedup:>6.3f} {pred} {real}")
    if terms:
        click.echo("kernels: " + ", ".join(f"{t.kind.value} {t.tag} x{t.calls}" for t in terms))
        click.echo(f"realisation (median): {a:.3f}" if a is not None else "realisation: none (nothing saved)")
        for key, table in fitted.items():
            click.echo(f"{key}: " + ", ".join(f"{M}: {v:.3f}" for M, v in table.items()))
    if refused:
        _say_refused(sr, f"serving showed {a:.2f}x the saving the tuned kernels' times predict" if a is not None
                     else "the tuned kernels save nothing at the measured batch sizes", dry_run)
        return
    click.echo(f"wrote {path}" if path else "dry run: nothing written")


def _say_refused(sr, msg: str, dry_run: bool) -> None:
    """A realisation the kernels do not explain: said, and (unless a dry run) exit 1."""
    lo, hi = sr.REALISATION_PLAUSIBLE
    click.echo(f"{msg} (outside {lo}-{hi}): the kernels do not explain the change; "
               f"{'nothing written' if not dry_run else 'a write would be refused'} (--accept-realisation writes it)",
               err=not dry_run)
    if not dry_run:
        raise SystemExit(1)


def _refit_from_decode_steps(sr, log_pairs, gpu, model, kernel_report, tp_size, dtype, accept_realisation,
                             dry_run, as_json):
    from tuner.errors import ConfigError
    from tuner.sim.decode_ab import paired_server_logs

    if kernel_report is None or model is None:
        raise ConfigError("--logs needs --kernel-report and --model (the kernels' predicted saving per step)",
                          key="kernel_report")
    terms = _terms_for(sr, kernel_report, model, tp_size, dtype)
    pairs = [paired_server_logs(d, t) for d, t in log_pairs]
    for (d, t), p in zip(log_pairs, pairs):
        if p is None:
            click.echo(f"no pure-decode batch in both {d} and {t}: pair left out", err=True)
    fit = sr.decode_step_realisation(pairs, terms)
    a, lo_hi = fit.realisation, fit.interval
    plausible = sr.realisation_plausible(a)
    write = a is not None and not fit.confirms_kernels and (plausible or accept_realisation) and not dry_run
    refused = a is None or (not fit.confirms_kernels and not plausible and not accept_realisation)
    path = (sr.write_gpu_calibration(gpu, [], "decode steps of " + "; ".join(f"{d} vs {t}" for d, t in log_pairs),
                                     terms=terms, realised=a) if write else None)
    if as_json:
        emit_json({**fit.to_dict(), "kernels": [{"kind": t.kind.value, "tag": t.tag, "calls": t.calls} for t in terms],
                   "written": str(path) if path else None, "refused": refused and not dry_run})
        raise SystemExit(1 if refused and not dry_run else 0)
    click.echo(f"{'pair':>4} {'batch':>5} {'windows':>7} {'step_ms':>8} {'predicted':>9} {'measured':>9}")
    for r in fit.rows:
        click.echo(f"{r.pair:>4} {r.batch:>5} {r.windows:>7} {r.default_step_ms:>8.2f} {r.predicted_saving:>9.2%} "
                   f"{r.measured_saving:>9.2%}")
    click.echo("kernels: " + ", ".join(f"{t.kind.value} {t.tag} x{t.calls}" for t in terms))
    if a is None:
        click.echo("the tuned kernels save nothing at these batches: no realisation", err=True)
        raise SystemExit(1)
    interval = f" [{lo_hi[0]:.2f}, {lo_hi[1]:.2f}] (90%)" if lo_hi else ""
    click.echo(f"realisation (decode steps, pooled): {a:.2f}{interval}")
    if fit.confirms_kernels:
        click.echo("the interval holds 1: the kernel timings explain the servers' decode steps; nothing to refit")
        return
    if refused:
        _say_refused(sr, f"the servers' decode steps showed {a:.2f}x the saving the tuned kernels' times predict",
                     dry_run)
        return
    for key, table in sr.attributed_speedups(terms, a).items():
        click.echo(f"{key}: " + ", ".join(f"{M}: {v:.3f}" for M, v in table.items()))
    click.echo(f"wrote {path}" if path else "dry run: nothing written")


def _terms_for(sr, report: Path, model: str, tp_size: int, dtype: str | None):
    from tuner.errors import ConfigError

    if dtype is not None:
        return sr.kernel_terms(report, model, tp_size=tp_size, dtype=dtype)
    found = {}
    for d in ("bf16", "fp8_w8a8"):
        try:
            found[d] = sr.kernel_terms(report, model, tp_size=tp_size, dtype=d)
        except ConfigError:
            continue
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        return sr.kernel_terms(report, model, tp_size=tp_size, dtype="bf16")  # raises, naming what it holds
    raise ConfigError(f"{report} holds {model}'s kernels for both bf16 and fp8_w8a8: pass --dtype", key="dtype")


@kernels.command("worth")
@click.option("--model", required=True)
@click.option("--gpu", required=True, help="Catalog GPU name.")
@click.option("--quantization", default="bf16", show_default=True, help="The model's checkpoint key (bf16, fp8, ...).")
@click.option("--tp-size", type=int, required=True)
@click.option("--ep-size", type=int, default=1, show_default=True)
@click.option("--tuned-dir", required=True, type=click.Path(path_type=Path),
              help="A `tuner kernels tune -o` directory (configs/, reports/).")
@click.option("--min-gain", type=float, default=1.03, show_default=True)
@click.option("--chunked-prefill-size", type=int, default=None,
              help="The trial's chunked-prefill size (default: SGLang's for this GPU and TP size).")
@click.option("--max-running-requests", type=int, default=None,
              help="The trial's running-request limit (default: its decode CUDA-graph size).")
@click.option("--cuda-graph-max-bs", type=int, default=None,
              help="The trial's decode CUDA-graph size (default: SGLang's for this GPU and TP size).")
@click.option("--sglang-version", default=None, help="For SGLang's defaults above (default: the planner's).")
@click.option("--load-format", type=click.Choice(["auto", "dummy"]), default="auto", show_default=True,
              help="The trial's weights: real (auto) or random (dummy, SGLang's --load-format dummy). Random "
                   "weights make a biased gate (DeepSeek-V3's) send every token to the same few experts, "
                   "and then only tiles tuned under that routing count.")
@json_option
def worth_cmd(model, gpu, quantization, tp_size, ep_size, tuned_dir, min_gain, chunked_prefill_size,
              max_running_requests, cuda_graph_max_bs, sglang_version, load_format, as_json):
    """Is `moe-tile-configs: tuned` worth a trial here? Exit 0 if yes, 1 if not.

    Yes only if the tuned file for this shape exists, covers the batch sizes the trial runs (decode
    batches up to its running-request limit, prefill chunks up to its chunked-prefill size: SGLang
    serves every M with the file's nearest key), and its tune report measured a gain there.
    """
    from tuner.catalog import get_gpu, get_model
    from tuner.kernels.worth import tile_configs_worth_trial, trial_batch_range
    from tuner.planner.memory import default_batch_limits
    from tuner.catalog.routing import random_weight_flags, routed_expert_pool

    m = get_model(model)
    g = get_gpu(gpu)
    ckpt = m.checkpoint(quantization)
    chunk_default, graph_default = default_batch_limits(g.memory_mib, tp_size, sglang_version)
    batch_range = trial_batch_range(chunked_prefill_size or chunk_default, max_running_requests,
                                    cuda_graph_max_bs or graph_default)
    collapsed = routed_expert_pool(m, random_weight_flags({"load_format": load_format})) is not None
    v = tile_configs_worth_trial(m.name, g.device_name, ckpt.weight_format, tp_size=tp_size,
                                 ep_size=ep_size, tuned_dir=tuned_dir, min_gain=min_gain, batch_range=batch_range,
                                 collapsed_routing=collapsed)
    if as_json:
        emit_json({**v.__dict__, "batch_range": list(batch_range)})
    else:
        click.echo(("worth a trial: " if v.worth else "not worth a trial: ") + v.reason)
    raise SystemExit(0 if v.worth else 1)
