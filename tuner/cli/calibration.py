"""`tuner calibration refit`: the simulator's MoE tile speedups from kernel measurements."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option


@click.group()
def calibration():
    """The serving simulator's calibration (tuner/sim/calibration/<gpu>.yaml)."""


@calibration.command()
@click.option("--summary", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Kernel-tuning summary JSON (per batch size default_us and found_us), e.g. "
                   "results/kernels/h200/summary.json.")
@click.option("--gpu", required=True, help="Catalog GPU name; writes tuner/sim/calibration/<gpu>.yaml.")
def refit(summary, gpu):
    """Rewrite the GPU's calibration file with moe_tuned_speedup[M] = default_us / found_us from
    a kernel summary, keeping the file's own comments (docs/calibration.md)."""
    from tuner.catalog import get_gpu
    from tuner.errors import ConfigError
    from tuner.sim.calibrate import write_refit

    try:
        get_gpu(gpu)  # an unknown GPU is a clear error (exit 2) before anything is written
    except ConfigError as exc:
        raise ConfigError(exc.detail, key="--gpu") from None
    path, sizes = write_refit(summary, gpu)
    click.echo(f"wrote {path}: tuned speedups at {sizes}")


@calibration.command()
@click.option("--results", "results_dirs", multiple=True, default=("results",), show_default=True,
              help="Directory (or database) with real SGLang trials: study databases (*.db) and their server "
                   "logs under runs/<study>/trial-NNNN/. Repeat for several.")
@click.option("--hold-out", type=click.Choice(["none", "trial", "model"]), default="none", show_default=True,
              help="Also cross-validate: fit without each trial (or each model) and predict its load points.")
@click.option("--write", is_flag=True,
              help="Write the fit into tuner/sim/calibration/<gpu>.yaml as a `fitted` entry for the data's "
                   "context (SGLang version, attention backend, prefill CUDA graphs).")
@json_option
def fit(results_dirs, hold_out, write, as_json):
    """Fit the step-time model to real SGLang servers' own step logs.

    Stage 1 fits the decode and prefill mechanism (scheduler CPU per step and per request, fixed
    GPU time per layer, HBM share of weight and KV reads, prefill launch cost, GEMM and
    extend-attention efficiencies) to SGLang's 40-step decode windows with the prefill batches
    that ran inside them. Stage 2 scales prefill time so that the simulated mean prefill-forward
    stage equals SGLang's own (/metrics) on warm servers. It also reports the stalls of fresh
    servers (measured, not simulated). docs/calibration.md says what each value means and where
    it came from.
    """
    from datetime import date

    from tuner.bench.fidelity import format_report, held_out, run_fidelity
    from tuner.sim.calibrate import load_calibration, write_fitted
    from tuner.sim.stepfit import PARAMETERS, calibrate, fit_context, get_path, load_real_data

    def say(msg):
        if not as_json:
            click.echo(msg, err=True)

    trials, points = load_real_data(results_dirs)
    context = fit_context(trials)
    say(f"{len(trials)} trials, {sum(len(t.windows) for t in trials)} decode windows, {len(points)} load points; "
        f"context {context}")
    res = calibrate(trials, points, progress=lambda m: say(m) if "prefill scale" in m else None)
    doc = {
        "context": context, "trials": res.trials, "windows": res.windows,
        "parameters": [{"name": p.name, "prior": res.prior.get(p.name),
                        "fitted": get_path(res.calibration, p.path) if p.name in res.values else None,
                        "meaning": p.meaning, "fitted_from_data": p.name in res.values,
                        "at_bound": p.name in res.at_bound} for p in PARAMETERS],
        "prefill_scale": None if res.prefill_scale is None else {
            "scale": res.prefill_scale.scale, "points": res.prefill_scale.points},
        "warmup_stalls": None if res.warmup is None else res.warmup.as_dict(),
        "residuals": res.residuals, "calibration": res.as_overrides(),
    }
    say("checking the calibrated simulator on every load point (tuner bench fidelity)")
    # with the values as they are written (rounded), so the record is what the file reproduces
    written = load_calibration(trials[0].gpu.name, res.as_overrides())
    fid = run_fidelity(results_dirs, calibration=written)
    doc["fidelity"] = {k: fid[k] for k in ("mape", "verdict_agreement", "target_results", "passed")}
    rnd = lambda d: {k: None if v is None else round(v, 4) for k, v in d.items()}
    checked = {"load_points": len(fid["points"]), "mape": rnd(fid["mape"]), "verdict_agreement": fid["verdict_agreement"],
               "date": date.today().isoformat(), "command": "tuner bench fidelity --results "
                                                            + " ".join(results_dirs)}
    if hold_out != "none":
        doc["held_out"] = held_out(trials, points, by=hold_out, progress=say)
        checked["held_out"] = {"by": hold_out, "mape": rnd(doc["held_out"]["mape"]),
                               "verdict_agreement": doc["held_out"]["verdict_agreement"]}
    if write:
        gpu = trials[0].gpu.name
        name = f"{gpu}-sglang-{context['sglang_version']}-{context['attention_backend']}" + (
            "" if context["prefill_cuda_graph"] else "-eager-prefill")
        source = (f"tuner calibration fit --results {' '.join(results_dirs)} on {date.today().isoformat()}: "
                  f"{len(res.trials)} trials ({', '.join(res.trials)}), {res.windows} decode windows; "
                  f"docs/calibration.md")
        path = write_fitted(gpu, when=context, values=res.as_overrides(), name=name, source=source, checked=checked)
        doc["written"] = str(path)
    if as_json:
        emit_json(doc)
        return
    click.echo(_format_fit(doc))
    m = doc["fidelity"]["mape"]
    click.echo(f"\ncalibrated simulator on all {checked['load_points']} load points: P90 TTFT MAPE {m['p90_ttft_s']:.1%}, "
               f"P90 TPOT MAPE {m['p90_tpot_s']:.1%}, throughput {m['throughput_tokens_per_s']:.1%}, verdicts "
               f"{doc['fidelity']['verdict_agreement']:.0%} (tuner bench fidelity prints the table)")
    if "held_out" in doc:
        click.echo(f"\nheld out by {hold_out} (each fold fitted without it):")
        click.echo(format_report({**doc["held_out"], "skipped": []}))
    if write:
        click.echo(f"\nwrote {doc['written']}")


def _format_fit(doc: dict) -> str:
    lines = [f"{'parameter':<50}{'prior':>12}{'fitted':>12}  meaning (fitted: after the prefill scale)"]
    for p in doc["parameters"]:
        fitted = "-" if p["fitted"] is None else f"{p['fitted']:.4g}"
        note = " (at bound)" if p["at_bound"] else "" if p["fitted_from_data"] else " (not in the data: prior kept)"
        lines.append(f"{p['name']:<50}{p['prior']:>12.4g}{fitted:>12}  {p['meaning']}{note}")
    ps = doc["prefill_scale"]
    if ps:
        lines.append(f"\nprefill scale {ps['scale']:.3f} (simulated = SGLang's prefill-forward stage on warm servers):")
        for r in ps["points"]:
            lines.append(f"  {r['label']:<32} prefill forward {r['simulated_prefill_forward_s'] * 1e3:6.1f} ms "
                         f"simulated / {r['measured_prefill_forward_s'] * 1e3:6.1f} ms measured")
    ws = doc["warmup_stalls"]
    if ws:
        lines.append(f"\nfresh-server stalls (measured, not simulated): {ws['count_per_start']} per server start in "
                     f"its first {ws['over_s']} s of traffic, {ws['stall_s']} s each ({len(ws['stalls'])} over "
                     f"{ws['servers']} starts; {ws['later_per_min']:.2f} per minute later)")
    lines.append("\nwindow-time error per trial (calibrated model against the log):")
    for label, r in doc["residuals"].items():
        lines.append(f"  {label:<32} {r['windows']:4d} windows, median |error| {r['median_abs_error']:.1%}, "
                     f"mean {r['mean_error']:+.1%}, P90 |error| {r['p90_abs_error']:.1%}")
    return "\n".join(lines)
