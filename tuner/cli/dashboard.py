"""`tuner dashboard`: serve the live trial dashboard over the study database (read-only)."""

from __future__ import annotations

import click

from tuner.cli._common import storage_option


@click.command()
@storage_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. The default serves this machine only; use an SSH tunnel to view it "
                   "from elsewhere, or 0.0.0.0 to expose it (there is no authentication).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on; 0 picks a free one (the address printed says which).")
@click.option("--runs-dir", default="results/runs", show_default=True, type=click.Path(file_okay=False),
              help="Where the studies' trial directories are (`<runs-dir>/<study>/trial-NNNN`); "
                   "server logs are served only from inside a study's directory there.")
def dashboard(storage, host, port, runs_dir):
    """Serve the live trial dashboard: studies, trials, capacity-search measurements, charts.

    It reads the study database read-only and refreshes itself every few seconds, so it can run
    beside `tuner study start`. Open the printed address in a browser; it loads nothing from the
    internet.
    """
    from tuner.report.dashboard import serve

    # refuses a missing file, one that is not a database, or one of an older schema (it names the
    # upgrade), before listening
    from tuner.report.dashboard import check_database
    from tuner.storage import db

    check_database(storage)
    db.require_current(db.get_engine(storage, create=False, readonly=True), storage, readonly=True)
    serve(storage, host=host, port=port, runs_dir=runs_dir, print_fn=lambda s: click.echo(s, err=True))
