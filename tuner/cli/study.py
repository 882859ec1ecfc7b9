"""`tuner study ...`: start, resume, status, list, export."""

from __future__ import annotations

import sys

import click

from tuner.cli._common import emit_json, json_option, storage_option
from tuner.limits import MAX_SEED, MAX_TRIALS
from tuner.cli.study_report import report
from tuner.lifecycle import TrialStatus
from tuner.study.signals import stopping_on_signals
from tuner.vocabulary import AUTO_BACKEND, BackendKind, CapacityStart, Engine, names


@click.group()
def study():
    """Start, resume, inspect and export tuning studies.

    A study (studies/NAME.yaml) names the model, hardware, workload, search space and latency
    targets. Each trial launches a candidate configuration and searches the largest number of
    concurrent users that meets both P90 targets; Optuna picks the next configuration.
    """


def _backend_choice():
    return click.Choice(names(BackendKind, AUTO_BACKEND))


def parse_duration(text: str | None) -> float | None:
    """``540``, ``540s``, ``9m``, ``2h`` -> seconds (ConfigError otherwise)."""
    from tuner.errors import ConfigError

    if text is None:
        return None
    t = str(text).strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(t[-1:], None)
    number = t[:-1] if scale else t
    try:
        value = float(number) * (scale or 1)
    except ValueError:
        raise ConfigError(f"{text!r} is not a duration; give seconds (540) or 9m / 2h", key="--time-limit") from None
    if not (0 < value <= 30 * 86400):
        raise ConfigError(f"{text!r} must be more than 0 and at most 30 days", key="--time-limit")
    return value


def _resolve_backend(spec, requested: str | None) -> tuple[str, str]:
    from tuner.evaluation.registry import get_evaluator, resolve_auto

    kind = requested or spec.backend
    if kind == AUTO_BACKEND:
        kind, reason = resolve_auto(spec)
    else:
        reason = "chosen explicitly"
    get_evaluator(kind)  # fails now (exit 2) if the backend cannot be used here
    _check_extra_server_args(spec, kind)
    return kind, reason


def _check_extra_server_args(spec, kind: str | None = None) -> None:
    """The SGLang flags a study can emit (knobs, baseline, pinned server_flags, extra arguments)
    are checked against the target version's real flag set before any trial starts (exit 2),
    whichever backend runs the study; dummy weights need a backend that can load them."""
    from tuner.errors import ConfigError

    options = spec.backend_options or {}
    if options.get("load_format", "auto") != "auto" and kind in ("transformers", "serve-sim"):
        raise ConfigError(f"load_format {options['load_format']!r} needs the sglang backend (or the simulator); "
                          f"the {kind} backend cannot load dummy weights", file=spec.source_path,
                          key="backend_options.load_format")
    if spec.space().engine != "sglang":
        return
    from tuner.backends.sglang import check_study_flags

    check_study_flags(spec)


def _run(runner, spec, budget, as_json):
    from tuner.study.progress import StudyProgress

    progress = StudyProgress(spec.name, budget, enabled=not as_json)
    runner.on_event = progress.event
    with progress:
        outcome = runner.run(budget)
        progress.study_best(outcome.best_capacity_users, outcome.best_trial_number)
    if as_json:
        emit_json(outcome.to_dict())
    else:
        _print_outcome(outcome, runner.storage_url)
    if outcome.exit_code:
        click.echo(f"Error: {outcome.stopped_reason}", err=True)
        sys.exit(outcome.exit_code)


def _print_outcome(o, storage):
    click.echo(f"\nstudy {o.name} ({o.backend_kind}): {o.trials_run} trials in {o.wall_time_s:.1f} s; "
               f"{o.trials_failed} failed, {o.trials_infeasible} infeasible ({o.prescreened} screened out by the planner), "
               f"{o.trials_pruned} stopped early (could not beat the best)")
    if o.best_capacity_users is not None:
        base = o.baseline_capacity_users
        gain = ""
        if base:
            gain = f", {o.best_capacity_users / base:.2f}x the baseline's {base}"
        elif base == 0:
            gain = ", the baseline met the targets for no user count"
        click.echo(f"best: trial {o.best_trial_number} serves {o.best_capacity_users} users{gain}")
        click.echo(f"export it with: tuner study export {o.name} -o best.yaml" +
                   (f" --storage {storage}" if storage != "sqlite:///results/tuner.db" else ""))
    if o.stopped_reason:
        click.echo(f"stopped: {o.stopped_reason}")


@study.command()
@click.argument("name")
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=None, help="Configurations to launch (default: the study's `trials`).")
@click.option("--backend", type=_backend_choice(), default=None,
              help="Where trials run. auto: SGLang if installed and the study's GPUs are present, else the simulator.")
@storage_option
@click.option("--ray-address", default=None, help="Join this Ray cluster (default: start a local Ray).")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True, help="Trials run at once where resources allow.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None, help="Sampler and workload seed (default: the study's).")
@click.option("--max-failures", type=click.IntRange(min=1), default=None, help="Stop the study after this many failed trials.")
@click.option("--no-ray", is_flag=True, help="Run trials in this process, one at a time (no Ray).")
@click.option("--warm-start-from-simulator", "warm_k", type=click.IntRange(min=1), default=None, metavar="K",
              help="First run the study on the simulator (sibling study NAME-sim in the same storage, reused if "
                   "present), then launch its K best configurations right after the baseline.")
@click.option("--no-pruning", is_flag=True,
              help="Run every capacity search to the end, even when it can no longer beat the best trial.")
@click.option("--time-limit", "time_limit", default=None, metavar="DURATION",
              help="Wall-clock budget of this run (e.g. 540, 9m, 2h): no trial starts that this run's trials "
                   "say cannot finish in time, no load point starts that cannot end within it (its warm-up and "
                   "window, or as long as the trial's last point took), and at the limit running trials close "
                   "after their current load point (recorded as interrupted, measurements kept). Resume "
                   "continues the study.")
@click.option("--dry-run", is_flag=True,
              help="Launch nothing and write nothing: print, for each trial the sampler would run, the "
                   "server command line, environment, --config YAML and MoE tile files (SGLang, "
                   "transformers and serve-sim backends; no GPU needed).")
@json_option
def start(name, trials, backend, storage, ray_address, parallel, seed, max_failures, no_ray, warm_k, no_pruning,
          time_limit, dry_run, as_json):
    """Start study NAME (studies/NAME.yaml or a path) and run it to its trial budget."""
    from tuner.config.load import load_study
    from tuner.storage import db
    from tuner.study.runner import StudyRunner

    spec = load_study(name)
    if dry_run:
        _dry_run(spec, backend, trials or spec.trials, seed, warm_k, as_json)
        return
    db.parse_url(storage)
    kind, reason = _resolve_backend(spec, backend)
    limit_s = parse_duration(time_limit)
    with stopping_on_signals():  # SIGTERM and SIGHUP stop it as Ctrl-C does
        initial = []
        if warm_k:
            from tuner.study.warm_start import simulated_top_k

            sim_name, initial, reused = simulated_top_k(spec, storage, warm_k, use_ray=not no_ray,
                                                        ray_address=ray_address, parallel=parallel)
            click.echo(f"warm start: {len(initial)} configuration(s) from the simulated study {sim_name}"
                       + (" (reused)" if reused else ""), err=True)
            from tuner.study.trust import trust_line

            click.echo(trust_line(spec), err=True)
        runner = StudyRunner(spec, storage_url=storage, backend_kind=kind, backend_reason=reason, parallel=parallel,
                             ray_address=ray_address, use_ray=not no_ray, seed=seed, max_failures=max_failures,
                             prune=not no_pruning, initial_configs=initial, time_limit_s=limit_s)
        try:
            runner.create(trials or spec.trials)
            click.echo(f"backend: {kind} ({reason})", err=True)
            _run(runner, spec, trials or spec.trials, as_json)
        finally:
            runner.release()


def _dry_run(spec, backend, budget, seed, warm_k, as_json):
    """`study start --dry-run`: the servers each trial would launch; nothing launched or written."""
    from tuner.errors import ConfigError
    from tuner.evaluation.registry import get_evaluator
    from tuner.study.dryrun import dry_run, summary_lines

    if warm_k:
        raise ConfigError("--warm-start-from-simulator runs and stores a simulated study, and --dry-run writes "
                          "nothing: run the warm start without --dry-run", key="--dry-run")
    kind = backend or spec.backend
    if kind == AUTO_BACKEND:  # a dry run shows the real servers: the engine's own
        kind = BackendKind.SGLANG if spec.space().engine == Engine.SGLANG else BackendKind.TRANSFORMERS
    server_backend = getattr(get_evaluator(kind), "backend", None)
    if server_backend is None:
        raise ConfigError(f"backend {kind!r} launches no server processes, so a dry run has nothing to show; "
                          f"use --backend {BackendKind.SGLANG} (or transformers, serve-sim)", key="--backend")
    _check_extra_server_args(spec)
    trials = dry_run(spec, server_backend, budget, seed=seed)
    if as_json:
        emit_json({"study": spec.name, "backend": kind, "sampler": spec.sampler, "budget": budget,
                   "trials": [t.to_dict() for t in trials]})
        return
    for line in summary_lines(spec, kind, trials):
        click.echo(line)


@study.command()
@click.argument("name")
@click.option("--trials", type=click.IntRange(1, MAX_TRIALS), default=None,
              help="Total trial budget from now on (default: the budget it was started with, which is stored).")
@storage_option
@click.option("--ray-address", default=None, help="Join this Ray cluster (default: start a local Ray).")
@click.option("--parallel", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-failures", type=click.IntRange(min=1), default=None)
@click.option("--no-ray", is_flag=True, help="Run trials in this process, one at a time (no Ray).")
@click.option("--time-limit", "time_limit", default=None, metavar="DURATION",
              help="Wall-clock budget of this run (e.g. 540, 9m, 2h); see `study start --help`.")
@click.option("--capacity-start", type=click.Choice(names(CapacityStart)), default=None,
              help="Where each new trial's capacity search starts from now on (stored with the study): "
                   "start_users (gallop from capacity.start_users) or simulator (the simulator's predicted "
                   "capacity of the configuration, stepping out by capacity.resolution_users: two load "
                   "points when the prediction is right). Capacities found stay comparable: both search "
                   "to the same resolution.")
@click.option("--first-warmup-s", "first_warmup_s", type=click.FloatRange(0, 86_400), default=None,
              help="From now on a fresh server's first load point warms up this many seconds (stored with the "
                   "study as measurement.first_warmup_s): real SGLang stalls in its first ~35 s of traffic while "
                   "it compiles kernels, which the capacity search's first, deciding point should not measure.")
@click.option("--duration-s", "duration_s", type=click.FloatRange(1, 86_400), default=None,
              help="From now on each load point measures a window this many seconds long (stored with the "
                   "study as measurement.duration_s; each load point keeps its own): a longer window narrows "
                   "the 90% interval of its P90s, e.g. to repeat a best whose verdict sat inside its noise.")
@click.option("--kernel-warmup/--no-kernel-warmup", "kernel_warmup", default=None,
              help="From now on, before a fresh server's first load point, send one prompt per fused-MoE "
                   "tile-config variant so that the kernels SGLang compiles on first use are built before "
                   "anything is measured (stored with the study as measurement.kernel_warmup).")
@click.option("--confirm-marginal/--no-confirm-marginal", "confirm_marginal", default=None,
              help="From now on a verdict inside its own noise (a limit within the 90% interval of a P90, "
                   "pass or miss) is measured once more at the same user count and decided by both windows "
                   "together, their P90s averaged by requests (stored with the study as "
                   "capacity.confirm_marginal; costs one load point where it applies).")
@click.option("--repeat-trial", "repeat_trials", multiple=True, metavar="N[:KNOB=VALUE,...]",
              help="Measure trial N's configuration again, first, as a new trial (repeatable): one a time limit "
                   "interrupted, or a best whose capacity sat at the edge of its SLO. With :KNOB=VALUE,... the "
                   "repeat sets those knobs otherwise, an A/B of them against trial N on the same machine (e.g. "
                   "--repeat-trial 1:enable-hierarchical-cache=false); values as the search space writes them. "
                   "The earlier record stays; the repeat counts against the budget (raise --trials).")
@click.option("--no-pruning", is_flag=True,
              help="Run every capacity search of this run to the end, even when it can no longer beat the best.")
@json_option
def resume(name, trials, storage, ray_address, parallel, max_failures, no_ray, time_limit, capacity_start,
           first_warmup_s, duration_s, kernel_warmup, confirm_marginal, repeat_trials, no_pruning, as_json):
    """Continue study NAME to its budget (the one it was started with, or --trials).

    One process drives a study at a time (its driver lease in the database). A driver on this
    host that died (kill -9, a crash, a reboot) is taken over at once: the processes it left --
    trial servers, its local Ray -- are reaped by recorded identity (PID, start time, command
    line), and its running trials are marked interrupted. A live driver is refused with who
    holds the study (exit 4). A driver on another host is taken over once its heartbeat is older
    than 30 s (TUNER_LEASE_TTL_S changes it). Run resume from the directory the study was started
    in (trial logs and PID files are under results/runs/NAME)."""
    from tuner.storage import db, repo
    from tuner.study.proposer import RepeatRequest
    from tuner.study.runner import StudyRunner, load_existing

    spec = load_existing(storage, name)
    row = repo.get_study(db.reader_engine(storage), name)
    limit_s = parse_duration(time_limit)
    repeat_trials = [RepeatRequest.parse(r) for r in repeat_trials]
    if repeat_trials:
        _check_repeats(spec, storage, name, list(repeat_trials), trials or row.trials_budget)
    with stopping_on_signals():  # SIGTERM and SIGHUP stop it as Ctrl-C does
        runner = StudyRunner(spec, storage_url=storage, backend_kind=row.backend_kind, backend_reason="as started",
                             parallel=parallel, ray_address=ray_address, use_ray=not no_ray,
                             max_failures=max_failures, time_limit_s=limit_s, command="resume",
                             prune=not no_pruning, repeat_trials=list(repeat_trials))
        try:
            acquired = runner.take_over(on_wait=lambda text: click.echo(text, err=True))
            if acquired.previous is not None and not as_json:
                killed = sorted(p for p, o in runner.dead_driver_reaped.items() if o == "killed")
                click.echo(f"took over from the dead driver (PID {acquired.previous.pid} on "
                           f"{acquired.previous.host}: {acquired.why}); reaped {len(killed)} process(es) it left",
                           err=True)
            amended = _amend_stored_study(storage, spec, capacity_start, first_warmup_s, kernel_warmup,
                                          confirm_marginal, duration_s=duration_s, quiet=as_json)
            if amended is not spec:  # written under the lease
                spec = runner.study = amended
            recovered = runner.recover_interrupted()
            if recovered and not as_json:
                click.echo(f"marked {len(recovered)} interrupted trial(s): {recovered}", err=True)
            budget = trials or row.trials_budget
            if budget != row.trials_budget and not as_json:
                click.echo(f"budget: {budget} trials from now on (it was {row.trials_budget})", err=True)
            _run(runner, spec, budget, as_json)
        finally:
            runner.release()


def _check_repeats(spec, storage: str, name: str, numbers: list, budget: int) -> None:
    """--repeat-trial refused before anything is written: an unknown, baseline or never-launched
    trial, or a budget with no room left for the repeats."""
    from tuner.errors import ConfigError
    from tuner.storage import db, repo
    from tuner.study.proposer import TriedTrial, repeat_configs

    rows = repo.trials(db.reader_engine(storage), name)
    repeat_configs(spec, {t.trial_number: TriedTrial.of_row(t) for t in rows}, numbers)
    launched = repo.launched_count(rows)
    if launched + len(numbers) > budget:
        raise ConfigError(f"study {name!r} has launched {launched} of its {budget} trials: no room for "
                          f"{len(numbers)} repeat(s); give --trials {launched + len(numbers)} or more",
                          key="--repeat-trial")


def _amend_stored_study(storage: str, spec, capacity_start: str | None, first_warmup_s: float | None,
                        kernel_warmup: bool | None, confirm_marginal: bool | None = None, *,
                        duration_s: float | None = None, quiet: bool):
    """The stored study with how its new trials are searched and measured changed (what a capacity
    means stays)."""
    from tuner.config.load import stored_spec_yaml
    from tuner.storage import db, repo

    said: list[str] = []
    capacity: dict = {}
    measurement: dict = {}

    def amend(section: dict, key: str, value, current, says) -> None:
        if value is not None and value != current:
            section[key] = value
            said.append(says(value))

    amend(capacity, "start", capacity_start, spec.capacity.start,
          lambda v: f"capacity search of new trials starts from {v} (was {spec.capacity.start})")
    amend(capacity, "confirm_marginal", confirm_marginal, spec.capacity.confirm_marginal,
          lambda v: "a marginal pass is measured again before it counts" if v else "a marginal pass counts at once")
    amend(measurement, "first_warmup_s", first_warmup_s, spec.measurement.first_warmup_s,
          lambda v: f"a fresh server's first load point warms up {v:g} s "
                    f"(was {spec.measurement.first_warmup_s or spec.measurement.warmup_s:g} s)")
    amend(measurement, "duration_s", duration_s, spec.measurement.duration_s,
          lambda v: f"each load point measures a {v:g} s window (was {spec.measurement.duration_s:g} s)")
    amend(measurement, "kernel_warmup", kernel_warmup, spec.measurement.kernel_warmup,
          lambda v: "a fresh server's kernels are warmed up before its first load point" if v
          else "no kernel warm-up before a fresh server's first load point")
    changes = {}
    if capacity:
        changes["capacity"] = spec.capacity.model_copy(update=capacity)
    if measurement:
        changes["measurement"] = spec.measurement.model_copy(update=measurement)
    if not changes:
        return spec
    spec = spec.model_copy(update=changes)
    repo.set_study_spec(db.get_engine(storage, create=False), spec.name, stored_spec_yaml(spec))
    if not quiet:
        click.echo("; ".join(said) + "; stored with the study", err=True)
    return spec


@study.command()
@click.argument("name")
@storage_option
@click.option("--slo", "slo", default=None, metavar="ttft=S,tpot=S",
              help="What-if: how many users each trial serves at these P90 targets (seconds; e.g. "
                   "ttft=10,tpot=0.06, or tpot=60ms), answered from its stored load points without new "
                   "trials; where the stored points do not bracket the answer it says so.")
@json_option
def status(name, storage, slo, as_json):
    """Trials of study NAME: state, capacity, failures, why each stops where it does (the binding
    cause at its capacity); the best and the baseline."""
    from tuner.explain import parse_slo
    from tuner.study.summary import study_summary, what_if_summary

    summary = study_summary(storage, name)
    summary.update(_search_facts(summary, storage, name))
    if slo is not None:
        ttft, tpot = parse_slo(slo, summary["slo"]["p90_ttft_s"], summary["slo"]["p90_tpot_s"])
        summary["what_if"] = what_if_summary(summary, ttft, tpot)
    if as_json:
        emit_json(summary)
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = summary
    console.print(f"[bold]study {s['name']}[/bold]  backend {s['backend_kind']}  status {s['status']}  "
                  f"trials {s['trials_launched']}/{s['trials_budget']}  target {s['target_users']} users at "
                  f"P90 TTFT <= {s['slo']['p90_ttft_s']} s, P90 TPOT <= {s['slo']['p90_tpot_s'] * 1000:.0f} ms")
    table = Table()
    for col in ("trial", "status", "users", "P90 TTFT s", "P90 TPOT ms", "configuration / reason"):
        table.add_column(col)
    base_params = (s["baseline"] or {}).get("params", {})
    for t in s["trials"]:
        # show what differs from the baseline: shorter, and what a reader wants to compare
        diff = {k: v for k, v in t["params"].items() if v is not None and base_params.get(k) != v}
        if t["is_baseline"]:
            cfg = " ".join(f"{k}={v}" for k, v in t["params"].items() if v is not None) + ", SGLang defaults otherwise"
        else:
            cfg = "baseline + " + " ".join(f"{k}={v}" for k, v in diff.items()) if diff else "baseline"
        detail = cfg if t["status"] == TrialStatus.COMPLETE else f"{t['failure_class']}: {t['failure_reason']}"
        at = t.get("at_capacity") or {}
        table.add_row(str(t["number"]) + (" B" if t["is_baseline"] else ""), t["status"],
                      "" if t["capacity_users"] is None else str(t["capacity_users"]),
                      _fmt(at.get("p90_ttft_s")), _fmt(at.get("p90_tpot_s"), 1000), detail[:300])
    console.print(table)
    if s["best"]:
        console.print(f"best: trial {s['best']['number']} with {s['best']['capacity_users']} users"
                      + (f" ({s['improvement_over_baseline']:.2f}x baseline)" if s.get("improvement_over_baseline") else ""))
    for n, least in (s.get("not_reproduced") or {}).items():
        t = next(x for x in s["trials"] if str(x["number"]) == n)
        console.print(f"trial {n}'s {t['capacity_users']} users were not reproduced: the same configuration "
                      f"served {least} in a repeat, so it counts as {least}")
    _print_why(console, s)
    if s.get("what_if"):
        _print_what_if(console, s)
    cost = s.get("cost") or {}
    console.print(f"{s['prescreened']} configuration(s) screened out by the planner (not launched), "
                  f"{s[TrialStatus.PRUNED]} trial(s) pruned"
                  + (f"; estimated real cost {cost['gpu_hours']:.1f} GPU-hours ({cost['launched_trials']} launches, "
                     f"{cost['load_points']} load points)" if "gpu_hours" in cost else ""))


def _print_why(console, s: dict) -> None:
    """Why each trial that served stops where it does; what the best could not measure."""
    from rich.markup import escape

    lines = [(t, t["bottleneck"]) for t in s["trials"] if t.get("bottleneck") and t["measurements"]]
    if not lines:
        return
    console.print("[bold]why[/bold] (the binding cause at each trial's capacity):")
    for t, b in lines:
        tag = " B" if t["is_baseline"] else (" best" if s["best"] and t["number"] == s["best"]["number"] else "")
        console.print(f"  #{t['number']}{tag}: {escape(b['sentence'])}", soft_wrap=True)
    best = (s.get("best") or {}).get("bottleneck") or {}
    if best.get("not_measured"):
        console.print(f"  not measured for trial {s['best']['number']}: "
                      + "; ".join(escape(f"{m['title']} ({m['why']})") for m in best["not_measured"]), soft_wrap=True)


def _print_what_if(console, s: dict) -> None:
    from rich.table import Table

    w = s["what_if"]
    slo = w["slo"]
    console.print(f"[bold]what if[/bold] P90 TTFT <= {slo['p90_ttft_s']:g} s and P90 TPOT <= "
                  f"{slo['p90_tpot_s'] * 1000:g} ms (from the stored load points; no new trials):")
    table = Table()
    for col in ("trial", "status", "users (study's targets)", "users (these)", "how the stored points answer"):
        table.add_column(col)
    for r in w["trials"]:
        table.add_row(str(r["trial"]) + (" B" if r["is_baseline"] else ""), r["status"],
                      "" if r["stored_capacity_users"] is None else str(r["stored_capacity_users"]), r["short"],
                      r["text"])
    console.print(table)
    if w["best"]:
        console.print(f"best at these targets: trial {w['best']['trial']}, {w['best']['text']}")
    else:
        console.print("no trial serves anyone at these targets within its stored load points")


def _search_facts(summary: dict, storage: str, name: str) -> dict:
    """Configurations the planner screened out, trials pruned, and the estimated GPU cost."""
    from tuner.study.cost import study_cost
    from tuner.study.runner import load_existing

    trials = summary["trials"]
    facts = {"prescreened": sum(1 for t in trials if t["screened_by_planner"]),
             TrialStatus.PRUNED.value: summary["counts"].get(TrialStatus.PRUNED, 0)}
    notes: list[str] = []
    try:
        facts["cost"] = study_cost(load_existing(storage, name, notes=notes), trials)
    except Exception as exc:  # the estimate is informative; status must still print
        facts["cost"] = {"error": str(exc)}
    for note in notes:  # a stored value today's schema refuses (read as its default for the estimate)
        click.echo(f"note: {note}", err=True)
    return facts


def _fmt(v, scale=1.0):
    return "" if v is None else f"{v * scale:.2f}"


@study.command(name="list")
@storage_option
@json_option
def list_(storage, as_json):
    """Studies in the database."""
    from tuner.study.summary import list_summaries

    rows = list_summaries(storage)
    if as_json:
        emit_json({"storage": storage, "studies": rows})
        return
    if not rows:
        click.echo(f"no studies in {storage}")
        return
    for r in rows:
        click.echo(f"{r['name']:<24} {r['backend_kind']:<12} {r['status']:<9} trials {r['trials_launched']:>3}/"
                   f"{r['trials_budget']:<3} best {r['best_capacity_users'] if r['best_capacity_users'] is not None else '-':>4}"
                   f" baseline {r['baseline_capacity_users'] if r['baseline_capacity_users'] is not None else '-'}")


@study.command()
@click.argument("name")
@click.option("-o", "--output", default=None, help="Write the YAML here (default: stdout).")
@click.option("--trial", "trial_number", type=int, default=None, help="Export this trial instead of the best.")
@click.option("--sglang-version", default=None, metavar="V",
              help="SGLang version you deploy (default 0.5.23; shipped flag sets: 0.5.17, 0.5.23). Flags it "
                   "lacks are refused with what it has instead; flags its --config parser refuses go on the "
                   "launch command in the header.")
@storage_option
def export(name, output, trial_number, sglang_version, storage):
    """The best configuration of NAME as a YAML file SGLang reads with --config."""
    from tuner.study.export import export_study

    text, notes = export_study(storage, name, output=output, trial_number=trial_number,
                               sglang_version=sglang_version)
    if output is None:
        sys.stdout.write(text)
    else:
        click.echo(f"wrote {output}", err=True)
    for n in notes:
        click.echo(n, err=True)


@study.command(name="tiles-ab")
@click.argument("name")
@click.option("--users", "users_text", required=True, metavar="N,N,...",
              help="User counts to replay on each variant, in this order (e.g. 16,24).")
@click.option("--trial", "trial_number", type=int, default=None,
              help="The trial whose configuration is served (default: the best).")
@click.option("--variants", default="default,tuned", show_default=True,
              help="Tile variants, in the order they are served (default: SGLang's own; tuned: the study's tuned "
                   "files). A variant named twice gets a second server: an A/A pair, whose difference is folded "
                   "into the tuned/default intervals (e.g. default,tuned,default).")
@click.option("-o", "--output", default=None, help="Also write the result as JSON here.")
@click.option("--refit-points", "refit_dir", default=None, type=click.Path(file_okay=False),
              help="Write DIR/default.json and DIR/tuned.json for `tuner kernels refit-serving`.")
@click.option("--tuned-dir", default=None, type=click.Path(file_okay=False),
              help="Tuned tile directory (what `tuner kernels tune -o` wrote) for the tuned variant; default: "
                   "the study's backend_options.moe_config_dir as stored when it was created, else results/kernels/<gpu>.")
@click.option("--probes", "probe_dir", default=None, type=click.Path(file_okay=False),
              help="Write DIR/default.probe.json and DIR/tuned.probe.json: the measured points as probe files "
                   "for `tuner bench fidelity --results DIR` (out-of-sample checks of the simulator).")
@storage_option
@json_option
def tiles_ab_cmd(name, users_text, trial_number, variants, output, refit_dir, tuned_dir, probe_dir, storage, as_json):
    """Serving A/B of MoE tile configs on this machine's GPUs: serve trial N's configuration of NAME
    with SGLang's own tiles, then with the tuned ones (`moe-tile-configs`), each on a fresh server, at
    the same user counts and seeds; print P90 TPOT, P90 TTFT and output throughput side by side.
    The tuned run counts only where its server log shows SGLang loading our files. Each ratio comes
    with a 90% interval of the windows' own noise and a verdict (`tuner workload compare-windows`,
    which also folds in the spread between servers from A/A pairs). Exit 0 when both variants
    measured every user count and the tuned files were proven loaded, 1 otherwise."""
    import json

    from tuner import safewrite
    from tuner.study.tiles_ab import parse_users, probe_documents, tiles_ab, write_probes, write_refit_points

    users = parse_users(users_text)
    chosen = tuple(v.strip() for v in variants.split(",") if v.strip())
    if output:
        safewrite.check_target(output)  # a bad path is refused before a server starts
    say = (lambda msg: None) if as_json else (lambda msg: click.echo(msg, err=True))
    def keep(ab) -> dict:  # after every point: an interrupted A/B keeps what it measured
        data = ab.to_dict()
        if refit_dir:
            data["refit_points"] = write_refit_points(ab, refit_dir)
        if output:
            safewrite.write_text(output, json.dumps(data, indent=1) + "\n")
        if probe_dir:
            write_probes(probe_documents(data, ab.spec, ab.trial), probe_dir)
        return data

    ab = tiles_ab(storage, name, users=users, trial_number=trial_number, variants=chosen, progress=say,
                  tuned_dir=tuned_dir, on_point=keep)
    data = keep(ab)
    complete = all(v.error is None and len(v.load_points) == len(users) for v in ab.variants)
    if as_json:
        emit_json(data)
    else:
        ms = lambda x: "-" if x is None else f"{x * 1000:.1f}"
        click.echo(f"{name} trial {ab.trial_number}: tile A/B at {', '.join(map(str, users))} users")
        click.echo(f"{'users':>6} {'variant':<8}{'P90 TPOT ms':>12}{'P90 TTFT ms':>12}{'tok/s':>9}  tuned/default")
        for row in data["comparison"]:
            for v in ("default", "tuned"):
                p = row.get(v)
                if p is None:
                    continue
                ratio = ""
                if v == "tuned" and row.get("tuned_over_default"):
                    labels = {"p90_tpot_s": "P90 TPOT", "p90_ttft_s": "P90 TTFT", "throughput_tokens_per_s": "tok/s"}
                    ratio = "  ".join(f"{labels[k]} {x:.3f}x" for k, x in row["tuned_over_default"].items()
                                      if x is not None)
                click.echo(f"{row['users']:>6} {v:<8}{ms(p['p90_tpot_s']):>12}{ms(p['p90_ttft_s']):>12}"
                           f"{(p['throughput_tokens_per_s'] or 0):>9.0f}  {ratio}")
            noise = "its windows' noise and the servers' spread" if data["server_spread"] else "its windows' noise"
            for pair, c in [("tuned/default", row.get("intervals")), *(row.get("same_tiles") or {}).items()]:
                for r in ((c or {}).get("ratios") or []) + [x for x in [(c or {}).get("paired_tpot")] if x]:
                    click.echo(f"{'':>6} {pair:<15}{r['metric']:<12} {r['ratio']:.3f} [{r['low']:.3f}, "
                               f"{r['high']:.3f}] {r['verdict']}"
                               + (f" (90%, {noise})" if pair == "tuned/default" else " (A/A)"))
        for pair, d in (data.get("decode_steps") or {}).items():
            if d.get("ratio") is not None:
                lo, hi = d["interval"] or (float("nan"), float("nan"))
                click.echo(f"{pair}: pure-decode step at equal batch and context {d['ratio']:.3f} [{lo:.3f}, {hi:.3f}] "
                           f"(90%; {len(d['batches'])} batch sizes, {d['paired_windows']} paired log windows)")
        for v in ab.variants:
            if v.tiles == "tuned":
                click.echo(f"{v.name} tiles: {'proven loaded' if v.tiles_loaded else 'NOT proven loaded'}: {v.tiles_proof}")
            if v.error:
                click.echo(f"{v.name}: {v.error}")
    raise SystemExit(0 if complete and ("tuned" not in chosen or ab.proven) else 1)


@study.command(name="verify-export")
@click.argument("name")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--users", type=click.IntRange(min=1), default=None,
              help="Users to replay (default: the trial's capacity).")
@click.option("--trial", "trial_number", type=int, default=None, help="The trial CONFIG was exported from (default: the best).")
@click.option("--reference-trial", "reference_trial_number", type=int, default=None,
              help="Compare against this trial's measurement instead: a repeat of the same configuration "
                   "(`study resume --repeat-trial`), e.g. one measured with a longer window; its point's "
                   "seed, warm-up and window are replayed.")
@click.option("-o", "--output", default=None, help="Also write the result as JSON here.")
@storage_option
@json_option
def verify_export(name, config, users, trial_number, reference_trial_number, output, storage, as_json):
    """Start SGLang from an exported CONFIG (as its header's launch line says) on this machine's GPUs,
    replay NAME's workload at the trial's capacity and compare P90 TTFT and TPOT with what the trial
    measured there. The window is reached as the trial's load point reached it: its own warm-up,
    and the kernel warm-up where the trial had one or where the point was not its server's first.
    Exit 0 when both are within 10% and within the SLO, 1 otherwise."""
    import json

    from tuner import safewrite
    from tuner.study.verify_export import verify_export as run_check

    if output:
        safewrite.check_target(output)  # a bad path is refused before a server starts
    result = run_check(storage, name, config, users=users, trial_number=trial_number,
                       reference_trial_number=reference_trial_number)
    data = result.to_dict()
    if output:
        safewrite.write_text(output, json.dumps(data, indent=1) + "\n")
    if as_json:
        emit_json(data)
    else:
        def ms(x):
            return "-" if x is None else f"{x * 1000:.1f} ms"

        ref = ("" if result.reference_trial_number in (None, result.trial_number)
               else f" against its repeat, trial {result.reference_trial_number}")
        click.echo(f"{name} trial {result.trial_number}{ref} at {result.users} users, started from {config} "
                   f"(warm-up {result.replay_warmup_s:.0f} s, as the trial's load point had; server "
                   f"{result.server_before_window}):")
        def spread(d, key):
            lo_hi = (d or {}).get(key)
            return f" [{lo_hi[0] * 1000:.1f}-{lo_hi[1] * 1000:.1f}]" if lo_hi else ""

        for label, key, trial_v, export_v, diff in (
                ("TTFT", "ttft_s", result.trial_p90_ttft_s, result.export_p90_ttft_s, result.ttft_rel_diff),
                ("TPOT", "tpot_s", result.trial_p90_tpot_s, result.export_p90_tpot_s, result.tpot_rel_diff)):
            click.echo(f"  P90 {label}  trial {ms(trial_v)}{spread(result.trial_p90_spread, key)}  "
                       f"export {ms(export_v)}{spread(result.export_p90_spread, key)}  ({(diff or 0) * 100:.1f}% apart)")
        if result.export_p90_spread:
            click.echo("  [lo-hi]: a 90% interval of each P90 from the order statistics of its window (ms)")
        click.echo(f"  within 10%: {'yes' if result.within_agreement else 'NO'}; within the SLO: "
                   f"{'yes' if result.export_meets_slo else 'NO'}" + (f"; {result.note}" if result.note else ""))
    if not result.ok:
        sys.exit(1)


study.add_command(report)
