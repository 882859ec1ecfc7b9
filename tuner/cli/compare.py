"""`tuner compare STUDY_OR_FILE...`: studies side by side across hardware and quantization."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option, storage_option
from tuner.limits import MAX_TRIALS
from tuner.vocabulary import AUTO_BACKEND, BackendKind, names


@click.command()
@click.argument("targets", nargs=-1, required=True, metavar="STUDY_OR_FILE...")
@click.option("--gpu-hour-cost", "costs", default=None, metavar="GPU=COST,...",
              help="Cost per GPU-hour by catalog GPU name, e.g. h200=3.5,b200=6.0 (any currency): adds the cost "
                   "per served user-hour. Overrides the comparison file's gpu_hour_cost.")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Also write the comparison as one self-contained HTML file (table, bars, capacity against target).")
@storage_option
@click.option("--backend", type=click.Choice(names(BackendKind, AUTO_BACKEND)), default=None,
              help="Where studies that have not run yet run (default: each study's own; auto: SGLang where it and "
                   "the GPUs are present, else the simulator). Studies already in storage keep theirs.")
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=None,
              help="Trial budget of studies that have not run yet (default: each study's own).")
@click.option("--cross-seed/--no-cross-seed", "cross_seed", default=None,
              help="After the studies ran, also run each study's best configuration on the other studies that "
                   "can express it and have not tried it (hardware compared at the same configuration). Default: "
                   "the comparison file's cross_seed, else off.")
@click.option("--allow-different-workloads", is_flag=True,
              help="Compare studies that replay different workloads (their capacities are not comparable).")
@click.option("--no-ray", is_flag=True, help="Run trials in this process, one at a time (no Ray).")
@click.option("--ray-address", default=None, help="Join this Ray cluster (default: start a local Ray).")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True,
              help="Trials of one study run at once where resources allow.")
@json_option
def compare(targets, costs, output, storage, backend, trials, cross_seed, allow_different_workloads, no_ray,
            ray_address, parallel, as_json):
    """Set studies side by side: hardware and quantization, best capacity per node and per GPU, the
    best configuration, its bottleneck, its KV capacity and, with costs, the cost per served
    user-hour; plus each study's capacity against its SLO target scaled.

    STUDY_OR_FILE is a study (studies/NAME.yaml, a path, or a study already in --storage) or a
    comparison file listing studies (e.g. studies/compare-glm-5.1.yaml). Studies not in storage
    are run through the normal study runner (on the simulator where SGLang or the GPUs are
    absent); finished ones are reused; unfinished ones are continued.

    Exit 2 before anything runs for studies of different workloads (unless
    --allow-different-workloads), an unknown cost key or an unknown study; exit 2 after running
    when a compared study has no completed trial.
    """
    from tuner import safewrite
    from tuner.compare.html import render_html
    from tuner.compare.plan import plan_comparison, require_completed
    from tuner.compare.run import cross_seed as run_cross_seed, run_plan
    from tuner.compare.table import build
    from tuner.config.comparison import parse_costs
    from tuner.storage import db

    db.parse_url(storage)
    if output is not None:
        safewrite.check_target(output)
    plan = plan_comparison(list(targets), storage, gpu_hour_cost=parse_costs(costs), trials=trials,
                           allow_different_workloads=allow_different_workloads, cross_seed=cross_seed)
    say = (lambda s: None) if as_json else (lambda s: click.echo(s, err=True))
    ran = run_plan(plan, storage, backend=backend, use_ray=not no_ray, ray_address=ray_address, parallel=parallel,
                   wrap=None if as_json else _with_progress, say=say)
    require_completed(storage, [e.spec.name for e in plan.entries])
    seeded = {}
    if plan.cross_seed:
        seeded = run_cross_seed(plan, storage, ran, use_ray=not no_ray, ray_address=ray_address, parallel=parallel,
                                wrap=None if as_json else _with_progress, say=say)
    doc = build(plan, ran, storage, cross_seeded=seeded)
    if output is not None:
        out = safewrite.write_text(output, render_html(doc))
        say(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")
    if as_json:
        emit_json(doc)
    else:
        _print(doc)


def _with_progress(runner, spec, budget):
    from tuner.study.progress import StudyProgress

    progress = StudyProgress(spec.name, budget)
    runner.on_event = progress.event
    with progress:
        outcome = runner.run(budget)
        progress.study_best(outcome.best_capacity_users, outcome.best_trial_number)
    click.echo("", err=True)  # the progress display leaves its last line open
    return outcome


def _print(doc: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    import sys

    console = Console(width=None if sys.stdout.isatty() else 160)  # a file or a pipe gets whole names
    console.print(f"[bold]{escape(doc['comparison'])}[/bold]  workload {escape(doc['workload']['name'])}")
    table = Table()
    for col in ("study", "hardware", "quant", "backend", "users", "/node", "/GPU", "KV tokens", "cost/user-h",
                "bound by"):
        table.add_column(col)
    for r in doc["studies"]:
        b, kv, c = r["best"], r["kv_capacity_tokens"], r["cost"]
        hw = r["hardware"]
        table.add_row(
            r["name"], f"{hw['nodes']}x{hw['gpus_per_node']} {hw['gpu']}", (r["quantization"] or {}).get("label", "-"),
            r["backend_kind"], _users(b) if b else "-", f"{b['capacity_per_node']:g}" if b else "-",
            f"{b['capacity_per_gpu']:.3g}" if b else "-", _tokens(kv["total"]) if kv and kv["total"] else "-",
            f"{c['per_user_hour']:.3g}" if c and c["per_user_hour"] else "-",
            ((r["bottleneck"] or {}).get("binding") or "-").replace("_", " "))
    console.print(table)
    for r in doc["studies"]:
        if r["best"]:
            changes = " ".join(f"{k}={v}" for k, v in r["best"]["changes_from_baseline"].items()) or "the baseline"
            console.print(f"[bold]{escape(r['name'])}[/bold] best trial {r['best']['trial']}: {escape(changes)}",
                          soft_wrap=True)
        if r["bottleneck"] and r["bottleneck"]["sentence"]:
            console.print(f"  why: {escape(r['bottleneck']['sentence'])}", soft_wrap=True)
        room = [f"attn-dp {k['attn_dp_size']}: " + (_tokens(k["kv_tokens_total"]) if k["fits"] else "does not fit")
                for k in r["kv_room_by_attention_dp"]]
        if room:
            console.print("  KV room at SGLang defaults (planner): " + ", ".join(room), soft_wrap=True)
    _print_same_configuration(console, doc)
    rank = doc["ranking"]
    if rank["capacity_per_gpu"]:
        console.print("most users per GPU: " + " > ".join(rank["capacity_per_gpu"]))
    if rank["cost_per_user_hour"]:
        console.print("cheapest per served user-hour: " + " < ".join(rank["cost_per_user_hour"]))
    for n in doc["notes"]:
        console.print(f"note: {escape(n)}", soft_wrap=True)


def _users(x: dict) -> str:
    """A capacity; ">= N" where the capacity search stopped at its largest user count still meeting."""
    return (">= " if x.get("at_search_limit") else "") + str(x["capacity_users"])


def _same_cell(c: dict) -> str:
    if c["trial"] is None:
        return f"{c['study']} - ({c['reason']})"
    text = f"{c['study']} {_users(c) if c['capacity_users'] is not None else '-'}"
    from tuner.lifecycle import TrialStatus

    if c["status"] != TrialStatus.COMPLETE:
        text += f" ({c['status']}" + (", at least" if c["status"] == TrialStatus.PRUNED else "") + ")"
    if c["changed"]:
        text += " [" + ", ".join(f"{k}={c['params'].get(k)}" for k in c["changed"]) + "]"
    return text


def _print_same_configuration(console, doc: dict) -> None:
    rows = doc.get("same_configuration") or []
    if not rows:
        return
    from rich.markup import escape

    console.print("[bold]same configuration[/bold] (each study's best, as the others ran it; users):")
    for r in rows:
        cells = "; ".join(_same_cell(c) for c in r["in"])
        console.print(f"  best of {escape(r['source'])} (trial {r['source_trial']}): {escape(cells)}", soft_wrap=True)


def _tokens(v) -> str:
    return f"{v / 1e6:.2f} M" if v >= 1e5 else f"{v / 1e3:.0f} k"
