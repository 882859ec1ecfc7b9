"""`tuner bench ...`: benchmarks. `client` is here; other benchmarks register in ``_LAZY``."""

from __future__ import annotations

import importlib
import importlib.util

import click

from tuner.cli._common import emit_json, json_option

# name -> "module:attribute", imported only when used; skipped where the module is absent.
_LAZY = {"search": "tuner.cli.bench_search:search", "dashboard": "tuner.cli.bench_dashboard:dashboard",
         "fidelity": "tuner.cli.bench_fidelity:fidelity"}


class _BenchGroup(click.Group):
    def _lazy(self, name):
        module_name, attr = _LAZY[name].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                return None
            raise
        return getattr(module, attr, None)

    def list_commands(self, ctx):
        names = set(super().list_commands(ctx))
        names.update(n for n in _LAZY if importlib.util.find_spec(_LAZY[n].split(":")[0]) is not None)
        return sorted(names)

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is None and name in _LAZY:
            cmd = self._lazy(name)
        return cmd


@click.group(cls=_BenchGroup)
def bench():
    """Benchmarks: replay client ceiling, search efficiency, dashboard latency, simulator fidelity."""


def _int_list(ctx, param, value):
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or any(v < 1 for v in out):
        raise click.BadParameter("every step must be >= 1")
    return out


@bench.command()
@click.option("--streams", default="250,500,1000,1500,2000", show_default=True, callback=_int_list,
              help="Concurrency steps (comma-separated).")
@click.option("--rate", default=50.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Tokens per second per stream (50 = 20 ms per token).")
@click.option("--duration", "duration_s", default=6.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds each stream runs after the ramp.")
@click.option("--max-added-latency-p99-ms", default=2.0, show_default=True, type=click.FloatRange(min=0),
              help="Added latency bound for a step to pass.")
@click.option("--all-steps", is_flag=True, help="Run every step even after one fails.")
@json_option
def client(streams, rate, duration_s, max_added_latency_p99_ms, all_steps, as_json):
    """Ceiling of the replay client: concurrent streams, tokens/s, added latency.

    A local server (separate process) streams paced tokens stamped with their send time.
    """
    from tuner.workload.bench_client import bench_client

    doc = bench_client(streams=tuple(streams), rate=rate, duration_s=duration_s,
                       max_added_latency_p99_ms=max_added_latency_p99_ms, stop_after_failure=not all_steps)
    if as_json:
        emit_json(doc)
        return
    click.echo(f"{'streams':>8} {'tokens/s':>10} {'added p50 ms':>13} {'added p99 ms':>13} {'errors':>7} {'cpu':>5}  pass")
    for s in doc["steps"]:
        p50 = "-" if s["added_latency_p50_ms"] is None else f"{s['added_latency_p50_ms']:.2f}"
        p99 = "-" if s["added_latency_p99_ms"] is None else f"{s['added_latency_p99_ms']:.2f}"
        click.echo(f"{s['streams']:>8} {s['tokens_per_s']:>10,.0f} {p50:>13} {p99:>13} {s['errors']:>7} "
                   f"{s['client_cpu_fraction']:>5.0%}  {'yes' if s['passed'] else 'no'}")
    click.echo(f"max_concurrent_streams {doc['max_concurrent_streams']}, tokens_per_s {doc['tokens_per_s']:,.0f}, "
               f"added_latency_p99_ms {doc['added_latency_p99_ms']} (uvloop: {doc['uvloop']})")
