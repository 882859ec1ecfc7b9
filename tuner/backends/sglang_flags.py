"""The real SGLang 0.5.23 server flag set (``sglang_flags.json``, extracted from the wheel).

Used to refuse any flag tuner would emit or a user passes that ``sglang serve`` does not know,
with a did-you-mean, and to keep flags out of the ``--config`` YAML that SGLang's config parser
rejects (BooleanOptionalAction and other zero-argument custom actions).

Regenerate the data with ``python -m tuner.backends.sglang_flag_extract WHEEL -o
tuner/backends/sglang_flags.json``.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from tuner.errors import ConfigError

DATA_PATH = Path(__file__).with_name("sglang_flags.json")


@dataclass(frozen=True)
class FlagInfo:
    name: str  # canonical CLI name without dashes
    field: str
    kind: str  # value | store_true | list | boolean_optional | custom_action
    type: str  # int | float | str | bool | json
    choices: tuple | None
    config_yaml: str  # value | store_true | list | unsupported
    deprecated: bool = False

    @property
    def cli(self) -> str:
        return f"--{self.name}"


class FlagSet:
    """Canonical flags and aliases of one SGLang version."""

    def __init__(self, data: dict):
        self.version: str = data.get("sglang_version") or "?"
        self.wheel_sha256: str | None = data.get("wheel_sha256")
        self.flags: dict[str, FlagInfo] = {}
        self.aliases: dict[str, str] = {}
        for name, e in data["flags"].items():
            self.flags[name] = FlagInfo(
                name=name, field=e["field"], kind=e["kind"], type=e["type"],
                choices=tuple(e["choices"]) if e.get("choices") else None,
                config_yaml=e["config_yaml"], deprecated=bool(e.get("deprecated")),
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
        close = difflib.get_close_matches(key, [*self.flags, *self.aliases], n=3, cutoff=0.6)
        return f" (did you mean {', '.join('--' + c for c in close)}?)" if close else ""

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
def load_flagset(path: str | None = None) -> FlagSet:
    with open(path or DATA_PATH) as f:
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
