"""`tuner bench ...`: benchmarks of tuner itself (tuner.bench); each prints its figure."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option
from tuner.vocabulary import Sampler, names


@click.group()
def bench():
    """Benchmarks: replay client ceiling, search efficiency, capacity-search bisection, simulator cost
    and fidelity, dashboard latency, what a killed or stopped driver costs."""


def _print_doc(doc: dict, as_json: bool, format_lines) -> None:
    """A benchmark's document: as JSON, or as the lines ``format_lines`` makes of it."""
    if as_json:
        emit_json(doc)
        return
    for line in format_lines(doc):
        click.echo(line)


def _int_list(ctx, param, value):
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or any(v < 1 for v in out):
        raise click.BadParameter("every step must be >= 1")
    return out


@bench.command()
@click.option("--streams", default="250,500,1000,1500,2000", show_default=True, callback=_int_list,
              help="Concurrency steps (comma-separated).")
@click.option("--rate", default=50.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Tokens per second per stream (50 = 20 ms per token).")
@click.option("--duration", "duration_s", default=6.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds each stream runs after the ramp.")
@click.option("--max-added-latency-p99-ms", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Added latency bound for a step to pass.")
@click.option("--all-steps", is_flag=True, help="Run every step even after one fails.")
@json_option
def client(streams, rate, duration_s, max_added_latency_p99_ms, all_steps, as_json):
    """Ceiling of the replay client: concurrent streams, tokens/s, added latency.

    A local server (separate process) streams paced tokens stamped with their send time.
    """
    from tuner.bench.client import bench_client

    doc = bench_client(streams=tuple(streams), rate=rate, duration_s=duration_s,
                       max_added_latency_p99_ms=max_added_latency_p99_ms, stop_after_failure=not all_steps)
    if as_json:
        emit_json(doc)
        return
    click.echo(f"{'streams':>8} {'tokens/s':>10} {'added p50 ms':>13} {'added p99 ms':>13} {'errors':>7} {'cpu':>5}  pass")
    for s in doc["steps"]:
        p50 = "-" if s["added_latency_p50_ms"] is None else f"{s['added_latency_p50_ms']:.2f}"
        p99 = "-" if s["added_latency_p99_ms"] is None else f"{s['added_latency_p99_ms']:.2f}"
        click.echo(f"{s['streams']:>8} {s['tokens_per_s']:>10,.0f} {p50:>13} {p99:>13} {s['errors']:>7} "
                   f"{s['client_cpu_fraction']:>5.0%}  {'yes' if s['passed'] else 'no'}")
    click.echo(f"max_concurrent_streams {doc['max_concurrent_streams']}, tokens_per_s {doc['tokens_per_s']:,.0f}, "
               f"added_latency_p99_ms {doc['added_latency_p99_ms']} (uvloop: {doc['uvloop']})")


@bench.command()
@click.option("--study", "study_name", required=True, help="Study name (studies/NAME.yaml) or path.")
@click.option("--seeds", type=click.IntRange(min=1), default=5, show_default=True, help="Sampler seeds per sampler.")
@click.option("--budget", type=click.IntRange(min=1), default=60, show_default=True,
              help="Launched trials per run (the baseline included).")
@click.option("--space", default=None,
              help="Search space to benchmark instead of the study's (default: the study's, or <space>-bench "
                   "when the study's grid is too large to measure).")
@click.option("--samplers", default="default,tpe,random", show_default=True,
              help="Comma-separated sampler names.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes measuring missing table entries (default: CPU count).")
@click.option("--warm-start", "warm_start_k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Also measure the simulator warm start: top-K simulated configurations enqueued for a "
                   "perturbed 'reality' (0: skip).")
@click.option("--results-dir", type=click.Path(file_okay=False), default="results/search", show_default=True,
              help="Where the capacity tables are cached and the benchmark output is written.")
@click.option("--write/--no-write", default=True, show_default=True,
              help="Write <results-dir>/bench-<study>.json and .md.")
@json_option
def search(study_name, seeds, budget, space, samplers, workers, warm_start_k, results_dir, write, as_json):
    """Compare samplers on the simulator against the exhaustive grid of the same space.

    Every grid configuration's capacity is simulated once and cached in RESULTS_DIR (keyed by a hash
    of the study), then each sampler runs the runner's ask/tell loop against that table.
    """
    from tuner import safewrite
    from tuner.bench.search import bench_search, format_table

    valid = [n for n in names(Sampler) if n != Sampler.GRID]  # the grid is what they are measured against
    chosen = tuple(s.strip() for s in samplers.split(",") if s.strip())
    bad = [n for n in chosen if n not in valid]
    if bad or not chosen:
        raise click.BadParameter(f"unknown sampler(s) {bad}; valid: {', '.join(valid)}", param_hint="--samplers")
    doc = bench_search(study_name, seeds=seeds, budget=budget, samplers=chosen, space=space,
                       results_dir=Path(results_dir), workers=workers, quiet=as_json, warm_start_k=warm_start_k)
    text = format_table(doc)
    if write:
        out = Path(results_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"bench-{doc['study']}-{doc['space']}"
        safewrite.write_text(out / f"{stem}.json", json.dumps(doc, indent=2) + "\n")
        safewrite.write_text(out / f"{stem}.md", text + "\n")
    if as_json:
        emit_json(doc)
    else:
        click.echo(text)


@bench.command()
@click.option("--study", default="h200", show_default=True,
              help="Study (name or file) whose capacity search (start, maximum, resolution, growth, bisection) and SLO are run.")
@click.option("--model", default="glm-5.1", show_default=True, help="Catalog model.")
@click.option("--gpu", default="h200", show_default=True, help="Catalog GPU (8 per node).")
@click.option("--warmup-s", type=click.FloatRange(min=0), default=120, show_default=True)
@click.option("--duration-s", type=click.FloatRange(min=1), default=600, show_default=True)
@click.option("--users", default="10,25,50,100,150,200", show_default=True, callback=_int_list,
              help="User counts of the per-load-point table (comma-separated).")
@json_option
def sim(study, model, gpu, warmup_s, duration_s, users, as_json):
    """CPU cost of the simulator: one capacity search of the study, and each load point.

    The configuration is GLM-5.1-style NVFP4 with attention DP 8 and EP 8 behind a cache-aware
    router, on a coding-agent workload. The study's capacity search runs once with each bisection
    (its own first) side by side; the figures are CPU seconds of this process.
    """
    from tuner.bench.simulator_cost import format_lines, simulator_cost

    doc = simulator_cost(study=study, model=model, gpu=gpu, warmup_s=warmup_s, duration_s=duration_s,
                         users=tuple(users))
    _print_doc(doc, as_json, format_lines)


@bench.command()
@click.option("--seeds", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Workload samples simulated per configuration (a load point reads one drawn at random).")
@click.option("--max-users", type=click.IntRange(2, 1024), default=160, show_default=True)
@click.option("--step", "step_users", type=click.IntRange(1, 64), default=2, show_default=True,
              help="User grid of the simulated P90 curves.")
@click.option("--draws", type=click.IntRange(1, 1000), default=40, show_default=True,
              help="Searches per configuration, capacity setting and bisection.")
@click.option("--warmup-s", type=click.FloatRange(min=0), default=120, show_default=True)
@click.option("--duration-s", type=click.FloatRange(min=1), default=600, show_default=True)
@json_option
def bisect(seeds, max_users, step_users, draws, warmup_s, duration_s, as_json):
    """Load points per capacity search under each bisection (midpoint, interpolate), on P90 curves
    the simulator measured for three GLM-5.1 configurations, each load point from a workload sample
    drawn at random; mean capacities side by side (about 3 minutes per seed on one core)."""
    from tuner.bench.bisect import bench_bisect, format_lines

    doc = bench_bisect(seeds=seeds, max_users=max_users, step=step_users, draws=draws, warmup_s=warmup_s,
                       duration_s=duration_s, progress=lambda s: click.echo(s, err=True))
    _print_doc(doc, as_json, format_lines)


@bench.command()
@click.option("--repeats", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Times each experiment runs (each in a fresh study).")
@click.option("--ray", "use_ray", is_flag=True, help="Drivers start their local Ray (default: --no-ray trials).")
@json_option
def crash(repeats, use_ray, as_json):
    """kill -9 and SIGTERM of a running driver (serve-sim servers, tiny workload): the time from the
    kill to a resume that took the study over and ran it to its budget, the time a SIGTERM takes to
    stop the driver, and the trials lost, trials left running and processes left behind (targets: 0).

    Exits 1 while a target is missed."""
    import sys

    from tuner.bench.crash import bench_crash, format_lines

    doc = bench_crash(repeats=repeats, ray=use_ray, progress=(lambda s: None) if as_json else
                      (lambda s: click.echo(s, err=True)))
    if as_json:
        emit_json(doc)
    else:
        for line in format_lines(doc):
            click.echo(line)
    if not doc["passed"]:
        sys.exit(1)


def _add_lazy_commands() -> None:
    """Commands in their own modules (light to import: they import their work when run)."""
    from tuner.cli.bench_dashboard import dashboard
    from tuner.cli.bench_fidelity import fidelity

    bench.add_command(dashboard, name="dashboard")
    bench.add_command(fidelity, name="fidelity")


_add_lazy_commands()


@bench.command()
@click.option("--results", "results_dirs", multiple=True, default=("results",), show_default=True,
              help="Directory (or file) with real SGLang start-ups: study databases with their runs/ folders, "
                   "and planner probes (planner/*.json). Repeat for several.")
@json_option
def planner(results_dirs, as_json):
    """The memory planner against SGLang's own accounting, per configuration: KV tokens
    (max_total_num_tokens), weight memory and whether it started, with the matrix coverage.

    Exits 1 while a target is missed: at least 12 configurations covering GQA/MLA, bf16/fp8
    weights and KV, default/explicit mem-fraction-static, max-total-tokens and HiCache; KV tokens
    and weights within 1%; "fits" right for every configuration.
    """
    import sys

    from tuner.bench.planner import format_planner_report, run_planner_bench

    doc = run_planner_bench(results_dirs)
    if as_json:
        emit_json(doc)
    else:
        click.echo(format_planner_report(doc))
    if not doc["passed"]:
        sys.exit(1)


@bench.command(name="planner-probe")
@click.argument("matrix", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Where each configuration's probe (<name>.json, <name>.log.gz) is written, e.g. "
                   "results/h200-planner.")
@click.option("--only", multiple=True, help="Probe only this configuration (repeat for several).")
@click.option("--force", is_flag=True, help="Probe again configurations that have a probe file already.")
@click.option("--gpu-ids", default="", help="Comma-separated GPU ids for CUDA_VISIBLE_DEVICES (default: inherit).")
def planner_probe(matrix, out_dir, only, force, gpu_ids):
    """Start SGLang for each configuration of a planner MATRIX only until /server_info answers
    (or start-up fails), keep the snapshot and the server log, stop it (GPU).

    `tuner bench planner --results DIR` then compares them with the planner. A configuration with
    a probe file is skipped (--force probes it again), so an interrupted run resumes.
    """
    from tuner.evaluation.memory_probe import load_matrix, run_matrix

    m = load_matrix(matrix)
    ids = tuple(x.strip() for x in gpu_ids.split(",") if x.strip())
    docs = run_matrix(m, out_dir, only=tuple(only), force=force, gpu_ids=ids, progress=lambda s: click.echo(s, err=True))
    started = sum(1 for d in docs if d["started"])
    click.echo(f"probed {len(docs)} configurations into {out_dir}: {started} started, {len(docs) - started} did not")
