"""The real SGLang server flag sets, one per shipped version, extracted from the wheels.

``sglang-flags-<version>.json`` beside this module holds every flag of ``sglang serve`` of that
version: aliases, kind, type, static choices, default, and whether the version's ``--config``
parser accepts it in YAML. Used to refuse any flag tuner would emit or a user passes that the
target version does not know (with a did-you-mean and known replacements), and to put flags the
YAML parser rejects on the command line instead.

Regenerate with ``tuner sglang extract-flags WHEEL`` (``tuner.backends.sglang_flag_extract``).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from tuner.errors import ConfigError

_DATA_DIR = Path(__file__).parent
#: versions whose flag sets ship with tuner, oldest first
SUPPORTED_SGLANG_VERSIONS = ("0.5.17", "0.5.23")
#: what ``tuner study export`` targets and what is assumed where no SGLang is installed
DEFAULT_SGLANG_VERSION = "0.5.23"

# Flags one version lacks, and what does the same job there (shown when a knob is refused).
REPLACEMENTS: dict[str, dict[str, str]] = {
    "0.5.17": {
        "attn-dp-size": "--enable-dp-attention together with --dp-size N (attention DP ranks = dp-size)",
        "hicache-host-memory-fraction": "--hicache-ratio or --hicache-size",
        "cuda-graph-max-seq-len-prefill": "--cuda-graph-max-bs-prefill",
    },
    "0.5.23": {
        "cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
        "cuda-graph-bs": "--cuda-graph-bs-decode",
        "disable-piecewise-cuda-graph": "--disable-prefill-cuda-graph",
        "enable-dp-attention": "--attn-dp-size N",
    },
}


def flagset_path(version: str) -> Path:
    return _DATA_DIR / f"sglang-flags-{version}.json"


def resolve_version(version: str | None, *, key: str = "sglang_version", file: str | None = None) -> str:
    """A shipped flag-set version for ``version`` (None: the default).

    A patch release of a shipped version (``0.5.17.post1``) uses that version's flags; anything
    else is refused, naming what ships.
    """
    if version is None:
        return DEFAULT_SGLANG_VERSION
    v = str(version).strip().lstrip("v")
    if v in SUPPORTED_SGLANG_VERSIONS:
        return v
    for known in SUPPORTED_SGLANG_VERSIONS:
        if v.startswith(known + ".post") or v.startswith(known + "+") or v.startswith(known + "rc"):
            return known
    raise ConfigError(f"no flag set for SGLang {version!r}; tuner ships flag sets for "
                      f"{', '.join(SUPPORTED_SGLANG_VERSIONS)} (extract another with "
                      f"`tuner sglang extract-flags WHEEL`)", file=file, key=key)


@dataclass(frozen=True)
class FlagInfo:
    name: str  # canonical CLI name without dashes
    field: str
    kind: str  # value | store_true | list | boolean_optional | custom_action
    type: str  # int | float | str | bool | json
    choices: tuple | None
    config_yaml: str  # value | store_true | list | unsupported
    deprecated: bool = False
    default: Any = None  # the declared default (when static; None otherwise)

    @property
    def cli(self) -> str:
        return f"--{self.name}"


class FlagSet:
    """Canonical flags and aliases of one SGLang version."""

    def __init__(self, data: dict):
        self.version: str = data.get("sglang_version") or "?"
        self.wheel_sha256: str | None = data.get("wheel_sha256")
        self.config_yaml_rule: str = data.get("config_yaml_rule") or "any-spelling"
        self.flags: dict[str, FlagInfo] = {}
        self.aliases: dict[str, str] = {}
        for name, e in data["flags"].items():
            self.flags[name] = FlagInfo(
                name=name, field=e["field"], kind=e["kind"], type=e["type"],
                choices=tuple(e["choices"]) if e.get("choices") else None,
                config_yaml=e["config_yaml"], deprecated=bool(e.get("deprecated")),
                default=e.get("default") if e.get("default_static", True) else None,
            )
            for alias in e.get("aliases") or ():
                self.aliases[alias] = name

    def __contains__(self, name: str) -> bool:
        return self.canonical(name) is not None

    def canonical(self, name: str) -> str | None:
        """Canonical name for a flag or alias (dashes in front allowed), or None."""
        key = name.lstrip("-")
        if key in self.flags:
            return key
        return self.aliases.get(key)

    def info(self, name: str) -> FlagInfo:
        canon = self.canonical(name)
        if canon is None:
            raise KeyError(name)
        return self.flags[canon]

    def suggest(self, name: str) -> str:
        key = name.lstrip("-")
        replacement = REPLACEMENTS.get(self.version, {}).get(key)
        if replacement:
            return f" (did you mean {replacement}? That is how SGLang {self.version} does it)"
        close = difflib.get_close_matches(key, [*self.flags, *self.aliases], n=3, cutoff=0.6)
        return f" (did you mean {', '.join('--' + c for c in close)}?)" if close else ""

    def in_config_yaml(self, name: str) -> bool:
        """Whether this version's ``--config`` parser accepts the flag in YAML."""
        return self.info(name).config_yaml != "unsupported"

    def require(self, names: Iterable[str], *, where: str = "flags", file: str | None = None) -> None:
        """ConfigError naming every name that is not an SGLang flag, with suggestions."""
        bad = [n for n in names if n not in self]
        if bad:
            parts = [f"--{b.lstrip('-')}{self.suggest(b)}" for b in bad]
            raise ConfigError(
                f"not SGLang {self.version} server flag(s): {'; '.join(parts)}", file=file, key=where,
            )

    def check_value(self, name: str, value: Any, *, where: str = "flags") -> None:
        """ConfigError if ``value`` is not one of the flag's static choices or has the wrong type."""
        info = self.info(name)
        if value is None:
            return
        if info.choices is not None and info.kind != "list" and value not in info.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in info.choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"{value!r} is not a valid value for --{info.name}{hint}; valid: "
                f"{', '.join(map(str, info.choices))}", key=f"{where}.{name}",
            )
        if info.kind in ("store_true", "boolean_optional") and not isinstance(value, bool):
            raise ConfigError(f"--{info.name} is a switch: give true or false, not {value!r}",
                              key=f"{where}.{name}")
        if info.type == "int" and info.kind == "value" and (isinstance(value, bool) or not isinstance(value, int)):
            if not (isinstance(value, str) and info.name == "max-total-tokens"):  # accepts "128k"
                raise ConfigError(f"--{info.name} takes an integer, not {value!r}", key=f"{where}.{name}")
        if info.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"--{info.name} takes a number, not {value!r}", key=f"{where}.{name}")


@lru_cache(maxsize=None)
def load_flagset(version: str | None = None, *, path: str | None = None) -> FlagSet:
    """The flag set of a shipped SGLang version (default: DEFAULT_SGLANG_VERSION), or of a file."""
    if path is not None:
        with open(path) as f:
            return FlagSet(json.load(f))
    with open(flagset_path(resolve_version(version))) as f:
        return FlagSet(json.load(f))


def parse_extra_args(args: Iterable[str], *, where: str = "backend_options.extra_server_args",
                     flagset: FlagSet | None = None) -> list[str]:
    """Validate user-supplied extra ``sglang serve`` arguments; return them as an argv list.

    Accepts ``["--flag", "value", "--switch", "--k=v"]``. Every ``--name`` must be a real flag
    (or alias); tuner-owned flags (``--host``, ``--port``, ``--config``, ``--model-path``) are
    refused because tuner sets them itself.
    """
    fs = flagset or load_flagset()
    if isinstance(args, str):
        raise ConfigError("give a list of arguments, e.g. ['--log-level', 'info'], not one string", key=where)
    out = [str(a) for a in args]
    names = [a.split("=", 1)[0] for a in out if a.startswith("--")]
    if out and not out[0].startswith("--"):
        raise ConfigError(f"{out[0]!r} is not a flag: extra arguments start with --name", key=where)
    fs.require(names, where=where)
    owned = {"host", "port", "config", "model-path"}
    clash = sorted({fs.canonical(n) for n in names} & owned)
    if clash:
        raise ConfigError(f"{', '.join('--' + c for c in clash)} is set by tuner; remove it", key=where)
    return out
