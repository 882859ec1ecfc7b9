"""`tuner calibration refit`: the simulator's MoE tile speedups from kernel measurements."""

from __future__ import annotations

import click


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
