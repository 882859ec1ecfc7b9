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
    from tuner.report.dashboard import check_database, serve
    from tuner.storage import db
    from tuner.storage.models import SCHEMA_VERSION
    from tuner.storage.snapshot import read_current

    # refuses a missing file or one that is not a database before listening
    check_database(storage)
    engine = db.get_engine(storage, create=False, readonly=True)
    version = db.schema_version(engine) if db.has_schema(engine) else None
    echo = lambda s: click.echo(s, err=True)  # noqa: E731
    # an older schema (SQLite) is served from an upgraded copy taken now: the file stays as it
    # is; a newer one, or an older one elsewhere, is refused with what to do
    with read_current(storage) as current:
        if version is not None and version < SCHEMA_VERSION:
            echo(f"note: {db.describe(storage)} has tuner schema {version}; serving an upgraded copy of it as it is "
                 f"now (later writes do not show). `tuner db upgrade --storage {storage}` upgrades it in place")
            serve(current.url.render_as_string(hide_password=False), host=host, port=port, runs_dir=runs_dir,
                  print_fn=echo)
        else:
            serve(storage, host=host, port=port, runs_dir=runs_dir, print_fn=echo)
