"""`tuner bench fidelity`: the simulator's predictions against committed real measurements."""

from __future__ import annotations

import sys

import click

from tuner.cli._common import emit_json, json_option, profiles_option, use_profile_dirs


@click.command(name="fidelity")
@click.option("--results", "results_dirs", multiple=True, default=("results",), show_default=True,
              help="Directory (or file) with real measurements: study databases (*.db) and probe files "
                   "(*.probe.json, probes/*.json). Repeat for several.")
@click.option("--backend-kind", "backend_kinds", multiple=True, default=("sglang",), show_default=True,
              help="Measurement backends counted as real (tuner_measurements.backend_kind).")
@click.option("--sglang-version", default=None,
              help="Simulate this SGLang version instead of the one each trial recorded.")
@click.option("--calibration", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Calibration YAML to use on top of the GPU's (to try a refit before committing it).")
@click.option("--only-trials", "only_trials", multiple=True, metavar="NAMES",
              help="Only the load points of these trials: comma-separated `study#N` (a trial) or `study` (all "
                   "its trials), e.g. h200-sglang-qwen3#3,h200-sglang-qwen3#7. Repeatable.")
@click.option("--exclude-trials", "exclude_trials", multiple=True, metavar="NAMES",
              help="Leave out the load points of these trials (same names as --only-trials).")
@click.option("--noise-seeds", type=click.IntRange(0, 32), default=8, show_default=True,
              help="Also simulate each point on this many workload samples and report how far two windows of "
                   "the same point differ by chance (the MAPE a perfect model would show); 0 skips it.")
@click.option("--priors-only", is_flag=True,
              help="Predict with no fitted calibration entry (neither the GPU's own nor one transferred from a GPU "
                   "of its architecture): what the fits add. Skips the noise samples.")
@profiles_option
@json_option
def fidelity(results_dirs, backend_kinds, sglang_version, calibration, only_trials, exclude_trials, noise_seeds,
             priors_only, profile_dirs, as_json):
    """Predicted against measured P50/P90 TTFT, P90 TPOT, throughput and hit rate per load point,
    the MAPE of each, and whether the SLO verdicts agree.

    Exits 1 when a target is missed (P90 TTFT MAPE <= 20%, P90 TPOT MAPE <= 10%, verdicts agree
    on >= 95% of points) or a point cannot be predicted; the points off target are marked with !.

    Beside the targets it reports, not as targets: the figures for warm and fresh servers, per GPU,
    and for the trials no fit saw; the verdicts on the points clear of their SLO; and, where a load
    was measured more than once, how often two real servers' verdicts agree with each other.
    """
    from tuner.bench.fidelity import TrialSelection, format_report, run_fidelity

    use_profile_dirs(profile_dirs)

    def progress(i, n, point):
        if not as_json:
            click.echo(f"[{i + 1}/{n}] simulating {point.label}", err=True)

    doc = run_fidelity(results_dirs, backends=tuple(backend_kinds), sglang_version=sglang_version,
                       calibration=calibration, progress=progress,
                       selection=TrialSelection.parse(only_trials, exclude_trials), noise_seeds=noise_seeds,
                       priors_only=priors_only)
    if as_json:
        emit_json(doc)
    else:
        click.echo(format_report(doc))
    if not doc["passed"]:
        sys.exit(1)
