"""Command-line interface: one click group, subcommands loaded lazily.

Each area of tuner registers its commands in ``_COMMANDS`` as "module:attribute"; the module is
imported only when that command runs, so ``tuner --help`` stays fast (no Ray, Optuna or pandas).
This is the CLI's one lazy-loading mechanism: a command module imports what its commands run
inside their functions, and adds its own subcommands directly.
The single error boundary is :func:`main`: TunerError -> message + exit code; anything else ->
"Internal error" (traceback with --debug).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from tuner.errors import TunerError
from tuner.study.signals import stop_signal

# name -> (module:attribute, one-line help shown by `tuner --help` without importing the module)
_COMMANDS: dict[str, tuple[str, str]] = {
    "study": ("tuner.cli.study:study", "Start, resume, inspect and export tuning studies."),
    "compare": ("tuner.cli.compare:compare", "Set studies side by side: hardware, quantization, capacity, bottleneck, cost."),
    "validate": ("tuner.cli.validate:validate", "Check study / search-space / workload files without running anything."),
    "plan": ("tuner.cli.plan:plan", "Memory planner: weights, KV capacity and OOM risk of a configuration."),
    "simulate": ("tuner.cli.simulate:simulate", "Simulate one load point of a configuration on a study's workload."),
    "workload": ("tuner.cli.workload:workload", "Fit, import and inspect workloads."),
    "serve-sim": ("tuner.cli.serve_sim:serve_sim", "Run an OpenAI-compatible streaming server timed by the simulator."),
    "bench": ("tuner.cli.bench:bench", "Benchmarks: replay client ceiling, search efficiency, simulator cost and fidelity, dashboard latency, crash recovery."),
    "calibration": ("tuner.cli.calibration:calibration", "The simulator's calibration: fit it to real servers' step logs, recheck it, refit tile speedups."),
    "db": ("tuner.cli.db:db", "The study database: upgrade its schema, add the simulator's predictions."),
    "kernels": ("tuner.cli.kernels:kernels", "Tile configs for SGLang's fused-MoE and fp8 GEMM kernels: tune (GPU), compare, check a server log."),
    "sglang": ("tuner.cli.sglang:sglang", "SGLang versions tuner knows; extract another version's flag set."),
    "profile": ("tuner.cli.profile:profile", "Measure SGLang's operator times on a GPU for the simulator (GPU)."),
    "model": ("tuner.cli.model:model", "Make small local models for end-to-end runs (no download)."),
    "dashboard": ("tuner.cli.dashboard:dashboard", "Serve the live trial dashboard (read-only)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(_COMMANDS)

    def get_command(self, ctx, name):
        if name not in _COMMANDS:
            return None
        module_name, attr = _COMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx, formatter):
        # Short help from the table: listing commands must not import them.
        rows = [(name, _COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tuner", prog_name="tuner")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
@click.pass_context
def cli(ctx, debug):
    """tuner: find the SGLang configuration that serves the most users within your latency targets.

    \b
    Typical use:
      tuner validate studies/h200.yaml
      tuner study start h200              # simulator backend where no GPUs are present
      tuner study status h200
      tuner study export h200 -o best.yaml
      tuner dashboard
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if debug:
        os.environ["TUNER_DEBUG"] = "1"


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="tuner", standalone_mode=False)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns a stop signal into Abort
            sig = stop_signal(exc.__cause__)
            click.echo(f"Error: {sig.reason}.", err=True)
            sys.exit(sig.exit_code)
        click.echo("Aborted!", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TunerError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP where a command stops on them
        sig = stop_signal(exc)
        click.echo(f"Error: {sig.reason}.", err=True)
        sys.exit(sig.exit_code)
    except Exception:  # the one place internal errors are turned into a message
        if os.environ.get("TUNER_DEBUG") == "1" or "--debug" in (argv or sys.argv):
            raise
        click.echo("Internal error (rerun with `tuner --debug ...` for the traceback):", err=True)
        click.echo("  " + traceback.format_exc().strip().splitlines()[-1], err=True)
        sys.exit(1)
