"""`tuner validate PATH...`."""

from __future__ import annotations

import sys

import click

from tuner.cli._common import emit_json, json_option


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@json_option
def validate(paths, as_json):
    """Check study, search-space, workload and comparison YAML files without running anything.

    The kind of each file is recognised from its keys. A study with `sampler: grid` is also checked
    for a grid that fits its trial budget; a comparison's studies are loaded and checked too. Exit
    code 2 if any file is invalid.
    """
    from tuner.config.load import load_study, validate_file
    from tuner.errors import ConfigError
    from tuner.study.samplers import grid_configs
    from tuner.vocabulary import Sampler

    results = []
    for p in paths:
        try:
            kind = validate_file(p)
            if kind == "study":
                study = load_study(p)
                if study.sampler == Sampler.GRID:
                    grid_configs(study, study.trials)
            results.append({"path": p, "ok": True, "kind": kind})
        except ConfigError as exc:
            results.append({"path": p, "ok": False, "error": str(exc)})
    if as_json:
        emit_json({"files": results, "ok": all(r["ok"] for r in results)})
    else:
        for r in results:
            if r["ok"]:
                click.echo(f"ok      {r['path']} ({r['kind']})")
            else:
                click.echo(f"Error: {r['error']}", err=True)
    if not all(r["ok"] for r in results):
        sys.exit(2)
