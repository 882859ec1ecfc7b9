"""`tuner bench dashboard`: latency of the dashboard under concurrent GETs of a study page."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option


@click.command()
@click.option("--storage", default=None,
              help="Study database to serve (default: a fresh simulated study made for the benchmark).")
@click.option("--study", default=None, help="Study to request (needed with --storage).")
@click.option("--trials", type=click.IntRange(2, 200), default=30, show_default=True,
              help="Trials of the study made for the benchmark.")
@click.option("--concurrency", type=click.IntRange(1, 2000), default=200, show_default=True,
              help="Simultaneous GETs per round, each on its own connection.")
@click.option("--rounds", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option("--interval", "interval_s", type=click.FloatRange(0, 60), default=1.5, show_default=True,
              help="Seconds between rounds (longer than the dashboard's cache lifetime: rounds recompute).")
@click.option("--path", default=None, help="URL path to request instead of /api/studies/STUDY (e.g. /).")
@json_option
def dashboard(storage, study, trials, concurrency, rounds, interval_s, path, as_json):
    """Start `tuner dashboard --port 0` over a study database and time rounds of CONCURRENCY
    simultaneous GETs of the study page's data: p50 and p99 per round and overall (target: p99 <= 200 ms
    for 200 concurrent GETs)."""
    from tuner.report.bench import bench_dashboard

    doc = bench_dashboard(storage=storage, study=study, trials=trials, concurrency=concurrency, rounds=rounds,
                          interval_s=interval_s, path=path,
                          progress=(lambda s: None) if as_json else (lambda s: click.echo(s, err=True)))
    if as_json:
        emit_json(doc)
        return
    click.echo(f"{doc['requests']} GET {doc['url_path']} ({doc['concurrency']} concurrent x {doc['rounds']} rounds, "
               f"{doc['cpu_count']} CPUs): p50 {doc['p50_ms']:.1f} ms, p99 {doc['p99_ms']:.1f} ms, "
               f"max {doc['max_ms']:.1f} ms, errors {doc['errors']}; target p99 <= {doc['target_p99_ms']:.0f} ms: "
               + ("met" if doc["meets_target"] else "NOT met"))
    click.echo(f"dashboard CPU {doc['server_cpu_ms_per_request']} ms per request; machine load average "
               f"{doc['load_average_1min'][0]} -> {doc['load_average_1min'][1]} (other work on the machine "
               "shows up in the latencies)")
