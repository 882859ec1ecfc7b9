"""``tuner profile``: measured operator times for the simulator (plan and check on CPU; run on a GPU)."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option


@click.group()
def profile():
    """Measure SGLang's operator times at the shapes each GPU sees, for the simulator.

    \b
    tuner profile plan  ...           what would be timed (CPU)
    tuner profile run   ... -o FILE   time it on this machine's GPU with SGLang's own kernels
    tuner profile compose --profile FILE --whole-steps FILE   per-op sum against whole steps
    tuner profile comm --gpus 8 -o FILE   collectives between this machine's GPUs (several GPUs)
    tuner profile show FILE           what a profile covers
    """


def _config_options(fn):
    for opt in reversed([
        click.option("--model", required=True, help="Catalog model name (e.g. qwen3-30b-a3b)."),
        click.option("--hardware", default="h200", show_default=True,
                     help="Catalog GPU name the table is filed under; `run` refuses a machine whose GPU is "
                          "another (e.g. --hardware h100 on an H100)."),
        click.option("--tp-size", type=int, default=1, show_default=True,
                     help="Tensor parallelism whose per-GPU shapes are timed (one GPU is used)."),
        click.option("--attn-dp-size", type=int, default=None),
        click.option("--ep-size", type=int, default=None),
        click.option("--quantization", default=None, help="SGLang --quantization (fp8) or none for bf16."),
        click.option("--kv-cache-dtype", default=None),
        click.option("--attention-backend", default="triton", show_default=True),
        click.option("--sglang-version", default="0.5.17", show_default=True,
                     help="The SGLang installed where this runs (recorded in the profile)."),
        click.option("--ops", default=None,
                     help="Comma-separated operators: gemm,decode_attention,extend_attention,moe,layer_misc,sampling "
                          "(the default), and hicache_write (the scheduler's CPU time per HiCache write-through "
                          "backup, timed on the host; at --page-size)."),
        click.option("--page-size", type=int, default=None,
                     help="SGLang --page-size of the server the tables are for (default: SGLang's for this GPU "
                          "and backend); sets the pages of a HiCache backup."),
        click.option("--moe-variants", default="default", show_default=True,
                     help="default (SGLang's own tiles) and/or tuned (tuner's tuned tile files)."),
        click.option("--quick", is_flag=True, help="A coarse grid (minutes instead of tens of minutes)."),
        click.option("--load-format", type=click.Choice(["auto", "dummy"]), default="auto", show_default=True,
                     help="The weights the tables are for: dummy (random weights, as --load-format dummy serves "
                          "them) times fused MoE with the routing they give, a few experts per call for a "
                          "biased gate (DeepSeek-V3, GLM-5.x)."),
    ]):
        fn = opt(fn)
    return fn


def _plan(model, hardware, tp_size, attn_dp_size, ep_size, quantization, kv_cache_dtype, attention_backend,
          sglang_version, ops, page_size, moe_variants, quick, load_format):
    from tuner.profile import build_plan

    flags = {"tp-size": tp_size, "attention-backend": attention_backend}
    if load_format == "dummy":
        flags["load-format"] = "dummy"
    for k, v in (("attn-dp-size", attn_dp_size), ("ep-size", ep_size), ("kv-cache-dtype", kv_cache_dtype),
                 ("page-size", page_size)):
        if v is not None:
            flags[k] = v
    if quantization and quantization.lower() not in ("none", "bf16"):
        flags["quantization"] = quantization
    return build_plan(model, hardware, flags, sglang_version=sglang_version, quick=quick,
                      ops=tuple(o.strip() for o in ops.split(",") if o.strip()) if ops else None,
                      moe_variants=tuple(v.strip() for v in moe_variants.split(",") if v.strip()))


@profile.command("plan")
@_config_options
@json_option
def plan_cmd(as_json, **opts):
    """List the operators, shapes and grid sizes that `tuner profile run` would time."""
    p = _plan(**opts)
    doc = {
        "model": p.model.name, "gpu": p.gpu.name, "sglang_version": p.sglang_version,
        "attention_backend": p.attention_backend, "kv_cache_dtype": p.kv_cache_dtype,
        "parallel": {"tp": p.layout.tp, "attn_tp": p.layout.attn_tp, "ep": p.layout.ep, "moe_tp": p.layout.moe_tp},
        "gemms": [{"name": g.name, **g.key, "layers": g.layers} for g in p.gemm_list],
        "attention": p.attention.key, "extend_modes": list(p.extend_modes),
        "moe": p.moe.key if p.moe else None, "moe_routed_pool": p.moe_pool,
        "hicache_write": {**p.host_write.key, "page_tensor_bytes": p.host_write.page_tensor_bytes}
        if "hicache_write" in p.ops else None,
        "points": p.points(),
    }
    if as_json:
        emit_json(doc)
        return
    for k, v in doc.items():
        click.echo(f"{k}: {v}")


@profile.command("run")
@_config_options
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Profile to write, e.g. tuner/sim/profiles/h200/qwen3-30b-a3b-tp1-bf16-triton-0.5.17.json.")
@click.option("--model-path", default=None, type=click.Path(file_okay=False),
              help="Directory with the model's config.json (default: one written from the catalog).")
@click.option("--tuned-moe-dir", default=None, type=click.Path(file_okay=False),
              help="SGLANG_MOE_CONFIG_DIR-style directory with tuned tile files (for --moe-variants tuned).")
@click.option("--max-kv-tokens", type=int, default=16 << 20, show_default=True,
              help="KV buffer budget per timed point (tokens of one layer).")
@click.option("--repeats", type=int, default=10, show_default=True, help="Timed replays per point (median).")
def run_cmd(output, model_path, tuned_moe_dir, max_kv_tokens, repeats, **opts):
    """Time every operator on this machine's GPU with SGLang's own kernels and write the table."""
    import tempfile

    from rich.progress import Progress

    from tuner.errors import BackendUnavailableError
    from tuner.profile import CudaGraphTimer, run_profile, write_profile
    from tuner.profile.modelcfg import write_model_dir

    p = _plan(**opts)
    try:
        import torch  # noqa: F401

        import sglang  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(f"tuner profile run needs torch and SGLang on a GPU machine ({exc}); "
                                      "install the SGLang kit there (see its README)") from None
    from tuner.profile.sglang_kernels import SGLangKernels

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = model_path or str(write_model_dir(p.model, p.ckpt, tmp))
        kernels = SGLangKernels(p.model, p.gpu, model_dir=model_dir, flags=p.flags, kv_cache_dtype=p.kv_cache_dtype,
                                tuned_moe_dir=tuned_moe_dir, max_kv_tokens=max_kv_tokens)
        timer = CudaGraphTimer(repeats=repeats)
        with Progress(transient=True) as bar:
            task = bar.add_task("profiling", total=p.points())

            def progress(done, total, label):
                bar.update(task, completed=done, description=label[:60])

            doc = run_profile(p, kernels, timer, progress=progress,
                              provenance={"command": "tuner profile run " + " ".join(
                                  f"--{k.replace('_', '-')} {v}" for k, v in opts.items() if v not in (None, False)),
                                  "model_path": model_path or "config.json written from the catalog"})
    path = write_profile(doc, output)
    skipped = len(doc["provenance"]["skipped_points"])
    click.echo(f"wrote {path}: {len(doc['ops'])} tables, {p.points() - skipped} points timed, {skipped} skipped")


def _parse_sizes(ctx, param, value):
    if value is None:
        return None
    out = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        mult = 1
        for suffix, m in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
            if part.endswith(suffix):
                part, mult = part[: -len(suffix)], m
                break
        try:
            out.append(int(float(part) * mult))
        except ValueError:
            raise click.BadParameter(f"{part!r} is not a size (bytes, or a number with KiB, MiB or GiB)",
                                     param=param) from None
    return tuple(out)


@profile.command("comm")
@click.option("--gpus", type=int, required=True,
              help="GPUs in the group (a TP, attention-DP or EP group of this size); this machine's first N.")
@click.option("--hardware", default="h200", show_default=True, help="Catalog GPU name the table is filed under.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Profile to write, e.g. tuner/sim/profiles/h200/comm-8gpu-nvlink.json.")
@click.option("--ops", default=None,
              help="Comma-separated subset of all_reduce,all_gather,reduce_scatter,all_to_all (default: all).")
@click.option("--sizes", default=None, callback=_parse_sizes,
              help="Message sizes, comma-separated, in bytes or with KiB/MiB/GiB (default: 1KiB to 256MiB, x4).")
@click.option("--iters", type=int, default=20, show_default=True, help="Back-to-back calls per timed repeat.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Timed repeats per point (median).")
@click.option("--dry-run", is_flag=True, help="Print the plan and exit (CPU).")
def comm_cmd(gpus, hardware, output, ops, sizes, iters, repeats, dry_run):
    """Time NCCL collectives between this machine's GPUs and write the table the simulator reads.

    One process per GPU (torch.distributed, NCCL). The simulator uses the table for every group of
    --gpus GPUs on this GPU type (attention-TP all-reduce, attention-DP gather and reduce-scatter,
    all-to-all among the EP group) instead of its analytic link model. Needs several GPUs to
    measure anything: with --gpus 1 the collectives are local copies (a check of the tool only).
    """
    from tuner.catalog import get_gpu
    from tuner.profile.comm import DEFAULT_SIZES_BYTES, CommPlan, run_comm_profile
    from tuner.profile.runner import write_profile
    from tuner.sim.optable import COMM_OPS

    g = get_gpu(hardware)
    plan = CommPlan(gpus=gpus, ops=tuple(o.strip() for o in ops.split(",") if o.strip()) if ops else COMM_OPS,
                    sizes_bytes=sizes or DEFAULT_SIZES_BYTES, iters=iters, repeats=repeats)
    click.echo(f"{len(plan.ops)} collectives x {len(plan.sizes_bytes)} sizes ({plan.sizes_bytes[0]} B to "
               f"{plan.sizes_bytes[-1]} B) over {plan.gpus} GPU(s) of {g.name} ({g.torch_name}): "
               f"{plan.points()} points")
    if dry_run:
        return
    command = (f"tuner profile comm --gpus {gpus} --hardware {hardware} --iters {iters} --repeats {repeats}"
               + (f" --ops {ops}" if ops else "") + (f" --sizes {','.join(map(str, plan.sizes_bytes))}" if sizes else ""))
    doc = run_comm_profile(plan, gpu=g.name, expected_device_name=g.torch_name, command=command)
    path = write_profile(doc, output)
    skipped = len(doc["provenance"]["skipped_points"])
    click.echo(f"wrote {path}: {len(doc['ops'])} tables, {plan.points() - skipped} points timed, {skipped} skipped")


def _parse_overrides(ctx, param, values) -> dict:
    from tuner.safeyaml import loads

    out = {}
    for v in values:
        key, sep, raw = v.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{v!r} is not KEY=VALUE (e.g. num_hidden_layers=8)", param=param)
        out[key.strip()] = loads(raw) if raw.strip() else raw
    return out


@profile.command("compose")
@click.option("--profile", "profile_path", required=True, multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="The profile of the configuration; repeat to add tables of other files (the first names the "
                   "configuration).")
@click.option("--whole-steps", required=True, type=click.Path(exists=True, dir_okay=False),
              help="SGLang bench_one_batch --result-filename output, or timed server steps (JSON lines).")
@click.option("--fit-overhead", is_flag=True,
              help="Store the decode residual per batch size in the profile as its step_overhead table.")
@click.option("--model-override", "model_overrides", multiple=True, metavar="KEY=VALUE", callback=_parse_overrides,
              help="A config.json key of the model the whole steps ran, when it differs from the profile's "
                   "(e.g. num_hidden_layers=8 for a model too large for one GPU); repeatable.")
@click.option("--load-format", type=click.Choice(["auto", "dummy"]), default="auto", show_default=True,
              help="The weights the whole steps ran: dummy (random) routes a biased gate's tokens to a few "
                   "experts, and only a fused-MoE table timed that way (tuner profile run --load-format dummy) "
                   "covers them.")
@json_option
def compose_cmd(profile_path, whole_steps, fit_overhead, model_overrides, load_format, as_json):
    """Compare the per-operator sum of a profile with whole forward steps; prints each error.

    Exits 1 when the mean absolute error is above 10%.
    """
    import sys

    from tuner.profile import compose, fit_step_overhead, read_whole_steps

    steps = read_whole_steps(whole_steps)
    fmt = None if load_format == "auto" else load_format
    doc = compose(list(profile_path), steps, model_overrides, fmt)
    if fit_overhead:
        fit_step_overhead(list(profile_path), steps, model_overrides, fmt)
        doc["fitted_step_overhead"] = True
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"{'kind':<8}{'batch':>6}{'tokens':>8}{'prefix':>8}{'measured ms':>13}{'per-op sum ms':>15}"
                   f"{'error':>8}  roofline ops")
        for r in doc["rows"]:
            click.echo(f"{r['kind']:<8}{r['batch']:>6}{r['tokens']:>8}{r['prefix']:>8}{r['measured_s'] * 1e3:>13.3f}"
                       f"{r['per_op_sum_s'] * 1e3:>15.3f}{r['error']:>8.1%}  {','.join(r['ops_from_roofline']) or '-'}")
        pct = lambda v: "-" if v is None else f"{v:.1%}"
        click.echo(f"mean |error| {pct(doc['mean_abs_error'])} (decode {pct(doc['mean_abs_error_decode'])}, "
                   f"prefill {pct(doc['mean_abs_error_prefill'])}); target <= {doc['tolerance']:.0%}: "
                   f"{'met' if doc['within_tolerance'] else 'MISSED'}")
    if not doc["within_tolerance"]:
        sys.exit(1)


@profile.command("show")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@json_option
def show_cmd(path, as_json):
    """What a profile covers: each table's operator, shape and grid range."""
    from tuner.sim.optable import load_profile

    pf = load_profile(path)
    tables = [{"op": t.op, "name": t.name, "mode": t.mode, "variant": t.variant, "shape": t.shape,
               "range": {ax: [g[0], g[-1]] for ax, g in zip(t.axes, t.grid)}} for t in pf.tables]
    doc = {"path": pf.path, "gpu": pf.gpu, "sglang_version": pf.sglang_version,
           "attention_backend": pf.attention_backend, "model": pf.model, "provenance": pf.provenance,
           "tables": tables}
    if as_json:
        emit_json(doc)
        return
    if pf.sglang_version:
        click.echo(f"{pf.path}: {pf.gpu}, SGLang {pf.sglang_version}, {pf.attention_backend} attention, model {pf.model}")
    else:  # collectives only: the machine's, not an SGLang configuration's
        click.echo(f"{pf.path}: {pf.gpu}, collectives ({pf.provenance.get('library', '?')}) between "
                   f"{pf.parallel.get('gpus', '?')} GPU(s)")
    for t in tables:
        label = t["op"] + "".join(f" {x}" for x in (t["name"], t["mode"], t["variant"]) if x)
        click.echo(f"  {label:<34} {t['shape']}  {t['range']}")
