"""`tuner calibration`: the simulator's calibration files (MoE tile speedups, fitted step times,
rechecks, and the key groups of SGLang's shipped fused-MoE files)."""

from __future__ import annotations

from datetime import date

import click

from tuner.cli._common import emit_json, json_option, profiles_option, use_profile_dirs


@click.group()
def calibration():
    """The serving simulator's calibration (tuner/sim/calibration/<gpu>.yaml)."""


@calibration.command()
@click.option("--summary", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Kernel-tuning summary JSON (per batch size default_us and found_us), e.g. "
                   "results/kernels/h200/summary.json.")
@click.option("--gpu", required=True, help="Catalog GPU name; writes tuner/sim/calibration/<gpu>.yaml.")
@click.option("--compare", "compares", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="A `tuner kernels compare --routing collapsed` result (repeatable): its shape's speedups where "
                   "a collapsed router (random weights, biased gate) sends every token to the same few experts.")
def refit(summary, gpu, compares):
    """Rewrite the GPU's calibration file with moe_tuned_speedup[M] = default_us / found_us from
    a kernel summary, keeping the file's own comments (docs/calibration.md). With --compare, also
    the shapes' speedups under a collapsed routing, which the simulator uses for servers whose
    router collapses (and, without one, claims tuned tiles no gain there)."""
    from tuner.catalog import get_gpu
    from tuner.errors import ConfigError
    from tuner.sim.calibrate import write_refit

    try:
        get_gpu(gpu)  # an unknown GPU is a clear error (exit 2) before anything is written
    except ConfigError as exc:
        raise ConfigError(exc.detail, key="--gpu") from None
    path, sizes = write_refit(summary, gpu, tuple(compares))
    click.echo(f"wrote {path}: tuned speedups at {sizes}")


@calibration.command("moe-groups")
@click.option("--sglang-dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="SGLang's package directory (.../site-packages/sglang, or an unpacked copy of it).")
@click.option("--sglang-version", required=True, help="The release that directory holds, e.g. 0.5.17.")
@click.option("--triton-version", required=True,
              help="The Triton the servers run (SGLang reads its configs/triton_X_Y_Z/ first), e.g. 3.6.0 "
                   "for 0.5.17 on torch 2.11.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Table to update (default: the simulator's, tuner/sim/calibration/sglang-moe-config-groups.yaml).")
def moe_groups(sglang_dir, sglang_version, triton_version, out_path):
    """Record which batch-size keys of SGLang's shipped fused-MoE config files, and of its block-fp8
    linear kernel's files, share one tile config, for every GPU of the catalog. A fresh server
    compiles one kernel per tile config it runs, so the simulator's fresh-server stalls follow
    these groups (the linears' everywhere, the fused MoE's on GPUs whose servers were never
    measured). Other SGLang versions in the table are kept."""
    from pathlib import Path

    import yaml

    from tuner import safewrite, safeyaml
    from tuner.catalog import gpus
    from tuner.errors import ConfigError
    from tuner.kernels.config_groups import (config_root_of, groups_table, linear_config_ids, linear_configs_of,
                                             linear_groups)
    from tuner.kernels.configfile import device_file_name
    from tuner.sim.warmup import SHIPPED_GROUPS_FILE

    root = config_root_of(Path(sglang_dir))
    out = Path(out_path) if out_path else SHIPPED_GROUPS_FILE
    devices = sorted({g.torch_name for g in gpus().values()})
    table = groups_table(root, devices, triton_version)
    linear_dir = linear_configs_of(Path(sglang_dir))
    if linear_dir is None:
        raise ConfigError(f"{sglang_dir} holds no block-fp8 linear configs (looked in "
                          "kernels/ops/quantization/configs/ and srt/layers/quantization/configs/)", key="--sglang-dir")
    linear = {device_file_name(d): linear_groups(linear_dir, d) for d in devices}
    linear_ids = {device_file_name(d): linear_config_ids(linear_dir, d) for d in devices}
    current = {}
    if out.is_file():
        current = safeyaml.load_file(out) or {}
        if not isinstance(current, dict):
            raise ConfigError("root must be a mapping of SGLang versions", file=str(out))
    current[str(sglang_version)] = {
        "triton_version": str(triton_version),
        "source": f"tuner calibration moe-groups --sglang-version {sglang_version} --triton-version "
                  f"{triton_version} on {date.today().isoformat()}, from SGLang's configs/",
        "devices": table,
        "block_fp8_linear": linear,
        "block_fp8_linear_configs": linear_ids}
    header = ("# Which keys of SGLang's shipped fused-MoE config files share one tile config, per SGLang\n"
              "# version, device and shape selector; a selector not listed runs SGLang's default config.\n"
              "# block_fp8_linear: the same for its block-fp8 linear kernel's files, per device and weight shape;\n"
              "# block_fp8_linear_configs: which config each of those groups runs (equal ids: one kernel).\n"
              "# Written by `tuner calibration moe-groups` (tuner/kernels/config_groups.py); read by\n"
              "# tuner/sim/warmup.py for the fresh-server stalls of GPUs without a fit of their own.\n")
    safewrite.write_text(out, header + yaml.safe_dump(current, sort_keys=True, width=120, default_flow_style=None))
    for dev, shapes in table.items():
        click.echo(f"{dev}: {len(shapes)} shapes with a shipped file "
                   f"({sum(1 for s in shapes.values() if not s['exact_triton'])} from another Triton's directory), "
                   f"{len(linear.get(dev) or {})} block-fp8 linear shapes")
    click.echo(f"wrote {out}")


@calibration.command()
@click.option("--results", "results_dirs", multiple=True, default=("results",), show_default=True,
              help="Directory (or database) with real SGLang trials: study databases (*.db) and their server "
                   "logs under runs/<study>/trial-NNNN/. Repeat for several.")
@click.option("--hold-out", type=click.Choice(["none", "trial", "model"]), default="none", show_default=True,
              help="Also cross-validate: fit without each trial (or each model) and predict its load points.")
@click.option("--only-trials", "only_trials", multiple=True, metavar="NAMES",
              help="Fit on these trials only: comma-separated `study#N` (a trial) or `study` (all its trials), "
                   "e.g. h200-sglang-qwen3#0,h200-sglang-dsv3. Repeatable. The check still predicts every load "
                   "point and reports those of the trials left out separately (unseen by the fit).")
@click.option("--exclude-trials", "exclude_trials", multiple=True, metavar="NAMES",
              help="Fit without these trials (same names as --only-trials).")
@click.option("--write", is_flag=True,
              help="Write the fit into tuner/sim/calibration/<gpu>.yaml as a `fitted` entry for the data's "
                   "context (SGLang version, attention backend, prefill CUDA graphs).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the fitted values as a calibration YAML of their own, to try with "
                   "`tuner bench fidelity --calibration FILE` before writing the entry.")
@click.option("--whole-steps", "whole_step_files", multiple=True, type=click.Path(dir_okay=False),
              metavar="FILE",
              help="Also fit to whole forward steps measured alone (SGLang's one-batch benchmark), listed with "
                   "the configuration that ran them in a set file (tuner/sim/wholesteps.py), e.g. "
                   "results/profiles/h200/whole-steps.yaml; repeatable. They pin the forward; the windows then "
                   "say what the scheduler adds.")
@click.option("--hold", "holds", multiple=True, metavar="NAME",
              help="Keep this value as the calibration files give it instead of fitting it, where it was "
                   "measured directly: a parameter name of the fit's table, e.g. overhead.layer_s. "
                   "Repeatable. The scheduler's CPU (overhead.cpu_step_s, overhead.per_request_s: "
                   "results/h100-sglang/sched_probe.py) is held always, unless --free names it.")
@click.option("--free", "frees", multiple=True, metavar="NAME",
              help="Fit a value that is held by default because a probe measured it (overhead.cpu_step_s, "
                   "overhead.per_request_s). Repeatable.")
@profiles_option
@json_option
def fit(results_dirs, hold_out, only_trials, exclude_trials, write, out_path, whole_step_files, holds, frees,
        profile_dirs, as_json):
    """Fit the step-time model to real SGLang servers' own step logs.

    Stage 1 fits the decode and prefill mechanism (fixed GPU time per layer, HBM share of weight
    and KV reads, prefill launch cost, fused-MoE and extend-attention efficiencies) to SGLang's
    40-step decode windows with the prefill batches that ran inside them; the scheduler's CPU and
    the other linears' efficiency are measured, and held. Stage 2 scales prefill time so that the simulated mean prefill-forward
    stage equals SGLang's own (/metrics) on warm servers. It also reports the stalls of fresh
    servers (measured, not simulated). docs/calibration.md says what each value means and where
    it came from.
    """
    use_profile_dirs(profile_dirs)
    from tuner.bench.fidelity import format_report, held_out, run_fidelity, summarize_points
    from tuner.errors import ConfigError
    from tuner.sim.calibrate import fit_base, with_values, write_fitted
    from tuner.sim.measured import TrialSelection, trial_label
    from tuner.sim.stepfit import PARAMETERS, calibrate, fit_context, get_path, is_held, load_real_data
    from tuner.sim.wholesteps import read_whole_step_sets

    def say(msg):
        if not as_json:
            click.echo(msg, err=True)

    names = [p.name for p in PARAMETERS]
    for option, given in (("--hold", holds), ("--free", frees)):
        unknown = [h for h in given if h not in names]
        if unknown:
            raise ConfigError(f"no fitted parameter {unknown[0]!r}; valid: {', '.join(names)}", key=option)
    both = sorted(set(holds) & set(frees))
    if both:
        raise ConfigError(f"{both[0]} is given to both --hold and --free; give it to one", key="--free")
    holds = tuple(holds) + tuple(p.name for p in PARAMETERS if p.measured and p.name not in frees + holds)
    whole_steps = [ws for f in whole_step_files for ws in read_whole_step_sets(f)]
    all_trials, all_points = load_real_data(results_dirs)
    selection = TrialSelection.parse(only_trials, exclude_trials)
    if not selection.everything:
        selection.check({(t.study, t.trial) for t in all_trials} | {(p.study, p.trial) for p in all_points})
    trials = [t for t in all_trials if selection.keeps(t.study, t.trial)]
    points = [p for p in all_points if selection.keeps(p.study, p.trial)]
    if not trials:
        raise ConfigError("no selected trial has SGLang step lines in its server log", key="--only-trials")
    context = fit_context(trials)
    left_out = sorted({trial_label(t.study, t.trial) for t in all_trials} - {t.label for t in trials})
    say(f"{len(trials)} trials, {sum(len(t.windows) for t in trials)} decode windows, {len(points)} load points; "
        f"context {context}" + (f"; left out of the fit: {', '.join(left_out)}" if left_out else ""))
    # where other contexts' fits hold in part (an eager-prefill fit, for a server with prefill
    # graphs), the fit starts from their values and moves only what they leave open
    base, held = fit_base(trials[0].gpu.name, context)
    if held:
        say(f"held from the fits of other contexts (valid here): {', '.join(held)}")
    measured = [h for h in holds if not is_held(tuple(h.split(".")), held)]
    if measured:
        say("held as the calibration files give them (--hold): " + ", ".join(
            f"{h} {get_path(base, tuple(h.split('.'))):.4g}" for h in measured))
        held = held + measured
    if whole_steps:
        say(f"{sum(len(ws.steps) for ws in whole_steps)} whole steps in {len(whole_steps)} sets: "
            f"{', '.join(ws.label for ws in whole_steps)}")
    res = calibrate(trials, points, calibration=base, held=held,
                    progress=lambda m: say(m) if "prefill scale" in m else None, whole_steps=whole_steps)
    doc = {
        "context": context, "trials": res.trials, "left_out": left_out, "windows": res.windows,
        "held": held, "held_measured": measured,
        "parameters": [{"name": p.name, "prior": res.prior.get(p.name),
                        "fitted": get_path(res.calibration, p.path) if p.name in res.values else None,
                        "meaning": p.meaning, "fitted_from_data": p.name in res.values,
                        "held": is_held(p.path, held), "measured": p.name in measured,
                        "at_bound": p.name in res.at_bound} for p in PARAMETERS],
        "prefill_scale": None if res.prefill_scale is None else {
            "scale": res.prefill_scale.scale, "fitted": res.prefill_scale.fitted,
            "points": res.prefill_scale.points},
        "warmup_stalls": None if res.warmup is None else res.warmup.as_dict(),
        "residuals": res.residuals, "calibration": res.as_overrides(),
        "whole_steps": res.whole_steps,
    }
    say("checking the calibrated simulator on every load point of the context (tuner bench fidelity)")
    # with the values as they are written (rounded), over what they are written on, so the record
    # is what the file reproduces; points of other contexts are predicted by their own entries
    written = with_values(base, res.as_overrides())
    fid = run_fidelity(results_dirs, calibration=written, context=context)
    doc["fidelity"] = {k: fid[k] for k in ("mape", "verdict_agreement", "target_results", "passed")}
    doc["fidelity"]["points"] = fid["points"]
    checked = _fidelity_record(len(fid["points"]), fid, "tuner bench fidelity --results " + " ".join(results_dirs))
    fitted_on = set(res.trials)
    unseen = [pt for pt in fid["points"] if trial_label(pt["study"], pt["trial"]) not in fitted_on]
    if left_out and unseen:  # the honest check: load points of trials the fit never saw
        doc["unseen"] = {"trials": sorted({trial_label(pt["study"], pt["trial"]) for pt in unseen}),
                         **summarize_points(unseen), "points": unseen}
        checked["unseen"] = {"trials": doc["unseen"]["trials"], "load_points": len(unseen),
                             "mape": _rounded(doc["unseen"]["mape"]),
                             "verdict_agreement": doc["unseen"]["verdict_agreement"]}
    if hold_out != "none":
        doc["held_out"] = held_out(trials, points, by=hold_out, progress=say, whole_steps=whole_steps,
                                   calibration=base, held=held)
        checked["held_out"] = {"by": hold_out, "mape": _rounded(doc["held_out"]["mape"]),
                               "verdict_agreement": doc["held_out"]["verdict_agreement"]}
    if write:
        gpu = trials[0].gpu.name
        name = f"{gpu}-sglang-{context['sglang_version']}-{context['attention_backend']}" + (
            "" if context["prefill_cuda_graph"] else "-eager-prefill")
        path = write_fitted(gpu, when=context, values=res.as_overrides(), name=name,
                            source=_source(results_dirs, res, selection, whole_step_files), checked=checked, trials=res.trials)
        doc["written"] = str(path)
    if out_path:
        # values fitted over another context's (held) apply on this context's trials only
        doc["try_it"] = f"tuner bench fidelity --calibration {out_path}" + (
            f" --only-trials {','.join(res.trials)}" if held else "")
        doc["out"] = str(_write_override(out_path, res.as_overrides(), _source(results_dirs, res, selection, whole_step_files),
                                         doc["try_it"]))
    if as_json:
        emit_json(doc)
        return
    click.echo(_format_fit(doc))
    m = doc["fidelity"]["mape"]
    click.echo(f"\ncalibrated simulator on all {checked['load_points']} load points of the context: P90 TTFT MAPE {m['p90_ttft_s']:.1%}, "
               f"P90 TPOT MAPE {m['p90_tpot_s']:.1%}, throughput {m['throughput_tokens_per_s']:.1%}, verdicts "
               f"{doc['fidelity']['verdict_agreement']:.0%} (tuner bench fidelity prints the table)")
    if "unseen" in doc:
        u = doc["unseen"]
        um = u["mape"]
        click.echo(f"on the {u['load_points']} load points of the {len(u['trials'])} trials left out of the fit "
                   f"({', '.join(u['trials'])}): P90 TTFT MAPE {um['p90_ttft_s']:.1%}, P90 TPOT MAPE "
                   f"{um['p90_tpot_s']:.1%}, throughput {um['throughput_tokens_per_s']:.1%}, verdicts "
                   f"{u['verdict_agreement']:.0%}:")
        click.echo(format_report({**u, "targets": fid["targets"], "skipped": []}))
    if "held_out" in doc:
        click.echo(f"\nheld out by {hold_out} (each fold fitted without it):")
        click.echo(format_report({**doc["held_out"], "skipped": []}))
    if write:
        click.echo(f"\nwrote {doc['written']}")
    if out_path:
        click.echo(f"wrote {doc['out']} (try it: {doc['try_it']})")


@calibration.command()
@click.option("--results", "results_dirs", multiple=True, default=("results",), show_default=True,
              help="Directory (or database) with real measurements, as `tuner bench fidelity` reads them. "
                   "Repeat for several.")
@click.option("--write", is_flag=True,
              help="Record the figures in each matching fitted entry of tuner/sim/calibration/<gpu>.yaml as its "
                   "`rechecked` record (its values and fit-time `checked` record stay; another GPU's points that "
                   "run the entry transferred go to `rechecked_on.<that gpu>`), which the warm start's trust "
                   "line then prints.")
@json_option
def recheck(results_dirs, write, as_json):
    """Check the committed fitted entries again, with today's simulator, on every real load point.

    A fitted entry's `checked` record holds the fidelity of the simulator it was fitted with, on the
    load points of that day. The simulator and the measurements move on; this predicts every real
    load point (as `tuner bench fidelity`), groups the points by the calibration context they run
    under (GPU, SGLang version, attention backend, prefill CUDA graphs) and prints each group's
    figures beside the entry that applies to it. A GPU without entries of its own runs those of a
    GPU of its architecture; its points are recorded beside them, under its own name
    (`rechecked_on.<gpu>`), for the warm start's trust line on that GPU. Without any real load
    point it is an error.
    """
    from tuner.bench.fidelity import point_context, run_fidelity, summarize_points
    from tuner.catalog import get_gpu
    from tuner.sim.calibrate import fitted_entries, load_calibration, record_recheck

    fid = run_fidelity(results_dirs)
    groups: dict[tuple, list[dict]] = {}
    for pt in fid["points"]:
        ctx = point_context(pt["model"], pt["gpu"], pt.get("flags") or {}, pt.get("sglang_version"))
        groups.setdefault((get_gpu(pt["gpu"]).name, tuple(sorted(ctx.items()))), []).append(pt)
    rows = []
    for (gpu, ctx_items), pts in groups.items():
        ctx = dict(ctx_items)
        record = _fidelity_record(len(pts), summarize_points(pts),
                                  "tuner calibration recheck --results " + " ".join(results_dirs))
        entries = fitted_entries(gpu, ctx)
        # without entries of its own the GPU may run another's (same architecture); those are not
        # rechecked on its points, which would mix two GPUs' records
        fitted_on = None if entries else load_calibration(gpu, context=ctx).get("fitted_on")
        row = {"gpu": gpu, "context": ctx, "fitted": [e.get("name") for e in entries], "rechecked": record,
               "checked": [e.get("checked") for e in entries], "written": None, "fitted_on": fitted_on}
        if write:
            for e in entries:
                row["written"] = str(record_recheck(gpu, when=e.get("when") or {}, rechecked=record))
            # a GPU running another's entries: the check goes beside them, under this GPU's name
            for e in (fitted_entries(fitted_on, ctx) if fitted_on else []):
                row["written"] = str(record_recheck(fitted_on, when=e.get("when") or {}, rechecked=record,
                                                    on_gpu=gpu))
        rows.append(row)
    if as_json:
        emit_json({"groups": rows, "skipped": fid["skipped"]})
    else:
        for row in rows:
            c, r = row["context"], row["rechecked"]
            where = (f"{row['gpu']}, SGLang {c['sglang_version']}, {c['attention_backend']} attention, "
                     f"{'prefill CUDA graphs' if c['prefill_cuda_graph'] else 'eager prefill'}")
            m = r["mape"]
            click.echo(f"{where}: {r['load_points']} load points, P90 TTFT MAPE {m['p90_ttft_s']:.1%}, "
                       f"P90 TPOT MAPE {m['p90_tpot_s']:.1%}, verdicts {r['verdict_agreement']:.1%}")
            if row["fitted_on"]:
                click.echo(f"  no fitted entry of its own: these points run on {row['fitted_on']}'s (same GPU "
                           f"architecture); --write records them there as its check on {row['gpu']}")
            elif not row["fitted"]:
                click.echo("  no fitted entry applies: these points run on the priors")
            for name, chk in zip(row["fitted"], row["checked"]):
                then = (f"{chk.get('load_points')} points on {chk.get('date')}: P90 TTFT MAPE "
                        f"{chk['mape']['p90_ttft_s']:.1%}, P90 TPOT MAPE {chk['mape']['p90_tpot_s']:.1%}, verdicts "
                        f"{chk['verdict_agreement']:.1%}") if isinstance(chk, dict) and chk.get("mape") else "no record"
                click.echo(f"  fitted entry {name}; checked when fitted: {then}")
            if row["written"]:
                click.echo(f"  recorded in {row['written']}")


@calibration.command("whole-steps")
@click.argument("set_files", nargs=-1, required=True, type=click.Path(dir_okay=False), metavar="SET_FILE...")
@click.option("--calibration", "calibration_file", type=click.Path(dir_okay=False), default=None,
              help="A calibration file of fitted values to try (`tuner calibration fit --out`) instead of the "
                   "committed entries.")
@click.option("--rows", "show_rows", is_flag=True, help="Also print every step, predicted against measured.")
@json_option
def whole_steps(set_files, calibration_file, show_rows, as_json):
    """Predict whole forward steps measured alone (SGLang's one-batch benchmark) with the committed
    calibration, each set under its own configuration's entry, and print the mean |error| by kind.

    SET_FILE lists the rows and what ran them (tuner/sim/wholesteps.py), e.g.
    results/profiles/h200/whole-steps.yaml or results/h100-sglang/prefill-probe/whole-steps.yaml.
    """
    from tuner.sim.calibrate import calibration_context, load_calibration
    from tuner.sim.stepfit import whole_step_errors
    from tuner.sim.wholesteps import read_whole_step_sets

    docs = {}
    for f in set_files:
        for ws in read_whole_step_sets(f):
            cal = load_calibration(ws.gpu.name, calibration_file,
                                   context=calibration_context(ws.model, ws.gpu, ws.flags, ws.sglang_version))
            docs[ws.label] = whole_step_errors(ws, cal)
    if as_json:
        emit_json({"sets": docs})
        return

    def pct(v):
        return "-" if v is None else f"{v:.1%}"

    click.echo(f"{'set':<42}{'gpu':>6}{'all':>8}{'prefill':>9}{'decode':>8}  fitted kinds")
    for label, e in docs.items():
        click.echo(f"{label:<42}{e['gpu']:>6}{pct(e['mean_abs_error']):>8}{pct(e['mean_abs_error_prefill']):>9}"
                   f"{pct(e['mean_abs_error_decode']):>8}  {', '.join(e['fitted_kinds'])}")
        if show_rows:
            for r in e["rows"]:
                click.echo(f"    {r['kind']:<8} batch {r['batch']:>3} x {r['tokens']:>6} tokens: "
                           f"{r['predicted_s'] * 1e3:9.1f} ms predicted, {r['measured_s'] * 1e3:9.1f} measured "
                           f"({r['error']:+.1%})")


@calibration.command("host-link")
@click.option("--results", "results_dirs", multiple=True, default=("results",), show_default=True,
              help="Directory (or database) with real measurements, as `tuner bench fidelity` reads them. "
                   "Repeat for several.")
@click.option("--min-tokens", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Leave out load points that loaded fewer tokens back (launch latency, not the link).")
@json_option
def host_link(results_dirs, min_tokens, as_json):
    """HiCache load-back as real SGLang servers achieved it: per load point, the tokens loaded back
    from host memory, the summed GPU time of the copies (SGLang's own /metrics), the rate and its
    share of the catalog's host link; then the share over all points, which is what the simulator's
    host_link_efficiency stands for. Needs HiCache servers whose device pool evicted and loaded
    back, started with --enable-metrics."""
    from tuner.sim.calibrate import load_calibration
    from tuner.sim.hostlink import load_back_samples, pooled_efficiency
    from tuner.sim.measured import load_points

    samples = load_back_samples(load_points(results_dirs).points, min_tokens=min_tokens)
    pooled = pooled_efficiency(samples)
    assumed = {s.gpu: load_calibration(s.gpu)["host_link_efficiency"] for s in samples}
    if as_json:
        emit_json({"points": [s.to_dict() for s in samples], "pooled_efficiency": round(pooled, 4),
                   "calibration_host_link_efficiency": assumed})
        return
    click.echo(f"{'load point':34s} {'KV':>9s} {'B/token':>8s} {'loads':>6s} {'tokens':>9s} {'copy s':>7s} "
               f"{'GB/s':>6s} {'of link':>8s}")
    for s in samples:
        click.echo(f"{s.label:34s} {s.kv_cache_dtype:>9s} {s.kv_bytes_per_token:8,d} {s.loads:6d} {s.tokens:9,d} "
                   f"{s.seconds:7.3f} {s.gbps:6.1f} {s.efficiency:8.1%}")
    now = ", ".join(f"{g} {v:.2f}" for g, v in sorted(assumed.items()))
    click.echo(f"over all {len(samples)} load points: {pooled:.1%} of the host link "
               f"(the simulator's host_link_efficiency: {now})")


def _rounded(mape: dict) -> dict:
    return {k: None if v is None else round(v, 4) for k, v in mape.items()}


def _fidelity_record(load_points: int, summary: dict, command: str) -> dict:
    """A fitted entry's fidelity record (``checked`` at the fit, ``rechecked`` later): the MAPEs and
    verdict agreement of a fidelity summary over that many load points, with the day and the command."""
    return {"load_points": load_points, "mape": _rounded(summary["mape"]),
            "verdict_agreement": summary["verdict_agreement"], "date": date.today().isoformat(), "command": command}


def _source(results_dirs, res, selection, whole_step_files=()) -> str:
    chosen = "".join(f" --only-trials {','.join(selection.only)}" if selection.only else "") + (
        f" --exclude-trials {','.join(selection.exclude)}" if selection.exclude else "")
    chosen += "".join(f" --whole-steps {f}" for f in whole_step_files)
    return (f"tuner calibration fit --results {' '.join(results_dirs)}{chosen} on {date.today().isoformat()}: "
            f"{len(res.trials)} trials ({', '.join(res.trials)}), {res.windows} decode windows; docs/calibration.md")


def _write_override(path, values: dict, source: str, use: str):
    """The fitted values as a calibration file of their own (whole or not at all)."""
    import yaml

    from tuner import safewrite

    target = safewrite.check_target(path)
    with safewrite.atomic_open(target) as f:
        f.write(f"# {source}\n# use: {use}\n")
        yaml.safe_dump(values, f, sort_keys=False)
    return target


def _format_fit(doc: dict) -> str:
    lines = [f"{'parameter':<50}{'prior':>12}{'fitted':>12}  meaning (fitted: after the prefill scale)"]
    for p in doc["parameters"]:
        fitted = "-" if p["fitted"] is None else f"{p['fitted']:.4g}"
        note = (" (at bound)" if p["at_bound"] else "" if p["fitted_from_data"] else
                " (held: measured, --hold)" if p.get("measured") else
                " (held: another context's fit gives it)" if p.get("held") else " (not in the data: prior kept)")
        lines.append(f"{p['name']:<50}{p['prior']:>12.4g}{fitted:>12}  {p['meaning']}{note}")
    ps = doc["prefill_scale"]
    if ps:
        lines.append(f"\nprefill scale {ps['scale']:.3f} (simulated = SGLang's prefill-forward stage on warm servers):"
                     if ps["fitted"] else
                     "\nprefill scale not fitted (what it would scale barely moves the stage: a launch cost the kernels "
                     "hide, the rest held); SGLang's prefill-forward stage on warm servers, a check:")
        for r in ps["points"]:
            lines.append(f"  {r['label']:<32} prefill forward {r['simulated_prefill_forward_s'] * 1e3:6.1f} ms "
                         f"simulated / {r['measured_prefill_forward_s'] * 1e3:6.1f} ms measured")
    ws = doc["warmup_stalls"]
    if ws:
        c = ws["calibration"]
        lines.append(f"\nfresh-server stalls: {ws['count_per_start']} per server start in its first {ws['look_s']:g} s "
                     f"of traffic, {ws['stall_s']} s each ({len(ws['stalls'])} over {ws['servers']} starts; "
                     f"{ws['later_per_min']:.2f} per minute later), at a rate decaying with a time constant of "
                     f"{ws['decay_s']} s; simulated in a deployment's first load point as fresh_server_stalls "
                     + (f"{c['per_new_kernel_s']:g} s per prefill step that runs a kernel variant new to the "
                        f"server (fused MoE: {len(c['moe_config_groups'])} config files' groups; block-fp8 "
                        f"linears: SGLang's files) over {ws['new_kernel_windows']} windows holding one"
                        if "per_new_kernel_s" in c else
                        f"{c['per_start']:g} per start x {c['stall_s']:g} s, decay {c['decay_s']:g} s"))
    if doc.get("whole_steps"):
        lines.append("\nwhole forward steps (calibrated model against the one-batch benchmark), mean |error|:")
        for label, r in doc["whole_steps"].items():
            parts = [f"{k} {r['mean_abs_error_' + k]:.1%}" + ("" if k in r["fitted_kinds"] else " (not fitted)")
                     for k in ("decode", "prefill") if r["mean_abs_error_" + k] is not None]
            lines.append(f"  {label:<40} {r['gpu']}: {r['mean_abs_error']:.1%} ({', '.join(parts)})")
    lines.append("\nwindow-time error per trial (calibrated model against the log):")
    for label, r in doc["residuals"].items():
        lines.append(f"  {label:<32} {r['windows']:4d} windows, median |error| {r['median_abs_error']:.1%}, "
                     f"mean {r['mean_error']:+.1%}, P90 |error| {r['p90_abs_error']:.1%}")
    return "\n".join(lines)
