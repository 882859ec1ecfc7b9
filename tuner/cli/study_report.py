"""`tuner study report NAME -o report.html`: a self-contained HTML report (and optional PNG charts)."""

from __future__ import annotations

from pathlib import Path

import click

from tuner.cli._common import storage_option


@click.command()
@click.argument("name")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The HTML file to write (one file: styles, scripts and charts inline, no external references).")
@storage_option
@click.option("--png", "png_dir", default=None, type=click.Path(file_okay=False),
              help="Also write each chart as a PNG into this directory (needs headless Chromium).")
@click.option("--runs-dir", default="results/runs", show_default=True, type=click.Path(file_okay=False),
              help="Where the study's trial directories are (to tell which server logs exist).")
def report(name, output, storage, png_dir, runs_dir):
    """Write a report of study NAME a colleague can read: best configuration, its capacity and
    latencies, the gain over the baseline, what was tried and what failed, and the dashboard's charts."""
    from tuner import safewrite
    from tuner.report import data
    from tuner.report.html import render_report

    safewrite.check_target(output)  # a bad path is refused before the study is read
    s = data.study(storage, name, runs_dir)
    s["storage"] = None  # a report is shared: keep the database URL (and any password) out of it
    for t in s["trials"]:
        t.pop("pids", None)
    importance = data.param_importances(storage, name)
    out = safewrite.write_text(output, render_report(s, importance))
    click.echo(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)", err=True)
    if png_dir:
        from tuner.report.png import render_pngs

        for p in render_pngs(out, Path(png_dir)):
            click.echo(f"wrote {p}", err=True)
