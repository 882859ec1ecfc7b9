"""`tuner sglang ...`: the SGLang versions tuner knows, and extracting another version's flag set."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option


@click.group()
def sglang():
    """SGLang versions: the shipped flag sets, and how to add one."""


@sglang.command(name="versions")
@json_option
def versions(as_json):
    """The SGLang versions whose flag sets ship with tuner, and the one installed here."""
    from tuner.backends.sglang import installed_sglang_version
    from tuner.catalog.sglang_flags import DEFAULT_SGLANG_VERSION, SUPPORTED_SGLANG_VERSIONS, load_flagset

    rows = [{"version": v, "flags": len(load_flagset(v).flags), "config_yaml_rule": load_flagset(v).config_yaml_rule}
            for v in SUPPORTED_SGLANG_VERSIONS]
    doc = {"versions": rows, "default": DEFAULT_SGLANG_VERSION, "installed": installed_sglang_version()}
    if as_json:
        emit_json(doc)
        return
    for r in rows:
        click.echo(f"{r['version']:<8} {r['flags']} flags, --config YAML rule: {r['config_yaml_rule']}"
                   + ("  (default)" if r["version"] == DEFAULT_SGLANG_VERSION else ""))
    click.echo(f"installed here: {doc['installed'] or 'none'}")


@sglang.command(name="extract-flags")
@click.argument("wheel", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Write the flag set here (tuner/catalog/sglang-flags-<version>.json to ship it); default stdout.")
def extract_flags(wheel, output):
    """Read every `sglang serve` flag of an SGLang WHEEL (pip download --no-deps sglang==V), without
    importing it: names, aliases, kinds, types, choices, defaults, and which flags that version's
    --config parser accepts."""
    from tuner import safewrite
    from tuner.backends.sglang_flag_extract import extract_from_wheel
    from tuner.errors import ConfigError

    try:
        data = extract_from_wheel(wheel)
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc), file=wheel) from None
    text = json.dumps(data, indent=1, default=str) + "\n"
    if output:
        safewrite.write_text(Path(output), text)
        click.echo(f"{data['flag_count']} flags of SGLang {data['sglang_version']} -> {output}", err=True)
    else:
        click.echo(text, nl=False)
