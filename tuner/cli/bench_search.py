"""`tuner bench search`: trials each sampler needs to reach 95% of the exhaustive grid's best."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option


@click.command()
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
    from tuner.study.bench_search import bench_search, format_table
    from tuner.study.samplers import SAMPLERS

    names = tuple(s.strip() for s in samplers.split(",") if s.strip())
    bad = [n for n in names if n not in SAMPLERS or n == "grid"]
    if bad or not names:
        raise click.BadParameter(f"unknown sampler(s) {bad}; valid: default, tpe, random, gp", param_hint="--samplers")
    doc = bench_search(study_name, seeds=seeds, budget=budget, samplers=names, space=space,
                       results_dir=Path(results_dir), workers=workers, quiet=as_json, warm_start_k=warm_start_k)
    text = format_table(doc)
    if write:
        out = Path(results_dir)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"bench-{doc['study']}-{doc['space']}"
        (out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
        (out / f"{stem}.md").write_text(text + "\n")
    if as_json:
        emit_json(doc)
    else:
        click.echo(text)
