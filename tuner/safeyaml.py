"""Bounded YAML reading for every file a user gives tuner (studies, search spaces, workloads).

PyYAML's ``safe_load`` builds no arbitrary objects but is otherwise unbounded: a duplicate key
silently replaces the first (an SLO can change without anyone noticing), a few lines of aliases
expand to billions of nodes when the result is walked or dumped, deep nesting overflows the stack
and a large file takes minutes. Here, before anything is built:

- the file is at most ``MAX_BYTES`` (checked with ``stat`` and a bounded read, so a 50 MB file
  or ``/dev/zero`` is refused at once);
- the event stream is scanned: at most ``MAX_DEPTH`` nested collections, ``MAX_ALIASES``
  aliases, ``MAX_NODES`` nodes counting every alias as the size of what it stands for, and no
  alias to a collection that contains it;
- duplicate keys in a mapping are an error naming both lines (merge keys ``<<`` still work, and
  a key written explicitly still overrides a merged one).

Every problem is a ConfigError (exit 2) naming the file, the key path where known and the line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from tuner.errors import ConfigError

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32
MAX_ALIASES = 64
MAX_NODES = 100_000
MAX_NUMBER_CHARS = 100  # a plain scalar of digits longer than this is no sensible number


def _looks_numeric(value: str) -> bool:
    return value.lstrip("+-").replace("_", "").replace(".", "").replace("e", "").replace("E", "").isdigit()

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where installed: parsing in C


def _path_text(path: list) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


class _Frame:
    __slots__ = ("kind", "anchor", "size", "key", "index", "expect_key", "line")

    def __init__(self, kind: str, anchor, line: int):
        self.kind, self.anchor, self.size, self.line = kind, anchor, 1, line
        self.key, self.index, self.expect_key = None, 0, True


def _scan(text: str, file: str | None) -> dict[tuple[int, int], str]:
    """Check depth, aliases and expanded size on the event stream; return the key path of every
    mapping by its start position (for the duplicate-key message)."""
    stack: list[_Frame] = []
    sizes: dict[str, int] = {}  # anchor -> expanded node count of what it names
    open_anchors: set[str] = set()
    paths: dict[tuple[int, int], str] = {}
    aliases = 0
    total = 0

    def where() -> list:
        out = []
        for f in stack:
            if f.kind == "map" and f.key is not None:
                out.append(f.key)
            elif f.kind == "seq":
                out.append(f.index)
        return out

    def key_of(frames) -> str:
        return _path_text(where()) or "(top level)"

    def add(n: int) -> None:
        nonlocal total
        total += n
        if total > MAX_NODES:
            raise ConfigError(f"the YAML expands to more than {MAX_NODES:,} values (aliases included); "
                              f"at {key_of(stack)}", file=file)
        for f in stack:
            f.size += n

    def finished_value() -> None:
        """A complete value (scalar, alias or collection) was read in the innermost collection."""
        if not stack:
            return
        f = stack[-1]
        if f.kind == "seq":
            f.index += 1
        else:
            if f.expect_key:
                f.expect_key = False
            else:
                f.key, f.expect_key = None, True

    try:
        for event in yaml.parse(text, Loader=_Base):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_DEPTH:
                    raise ConfigError(f"the YAML nests more than {MAX_DEPTH} levels deep at line "
                                      f"{event.start_mark.line + 1}", file=file)
                add(1)
                kind = "map" if isinstance(event, yaml.MappingStartEvent) else "seq"
                if kind == "map":
                    paths[(event.start_mark.line, event.start_mark.column)] = key_of(stack)
                stack.append(_Frame(kind, event.anchor, event.start_mark.line + 1))
                if event.anchor:
                    open_anchors.add(event.anchor)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                f = stack.pop()
                if f.anchor:
                    sizes[f.anchor] = f.size
                    open_anchors.discard(f.anchor)
                finished_value()
            elif isinstance(event, yaml.ScalarEvent):
                add(1)
                if event.implicit[0] and len(event.value) > MAX_NUMBER_CHARS and _looks_numeric(event.value):
                    raise ConfigError(f"a number of {len(event.value):,} characters at line "
                                      f"{event.start_mark.line + 1}; at most {MAX_NUMBER_CHARS}",
                                      file=file, key=key_of(stack))
                if event.anchor:
                    sizes[event.anchor] = 1
                if stack and stack[-1].kind == "map" and stack[-1].expect_key:
                    stack[-1].key = event.value
                finished_value()
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                line = event.start_mark.line + 1
                if aliases > MAX_ALIASES:
                    raise ConfigError(f"more than {MAX_ALIASES} aliases (line {line}); write the values out",
                                      file=file)
                if event.anchor in open_anchors:
                    raise ConfigError(f"alias *{event.anchor} at line {line} refers to a collection that "
                                      "contains it", file=file)
                if event.anchor not in sizes:
                    raise ConfigError(f"alias *{event.anchor} at line {line} names no anchor defined before it",
                                      file=file)
                add(sizes[event.anchor])
                finished_value()
    except yaml.YAMLError as exc:
        raise _malformed(exc, file) from None
    return paths


def _malformed(exc: yaml.YAMLError, file: str | None) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ConfigError(f"malformed YAML{where}: {problem}", file=file)


class _Loader(_Base):
    """Refuses duplicate keys; ``key_paths`` (from the scan) names the mapping they are in."""

    key_paths: dict[tuple[int, int], str] = {}
    file: str | None = None

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: the base class says so
                line = key_node.start_mark.line + 1
                if first is not None:
                    where = self.key_paths.get((node.start_mark.line, node.start_mark.column), "")
                    full = f"{where}.{key}" if where and where != "(top level)" else str(key)
                    raise ConfigError(f"duplicate key {key!r} at lines {first} and {line}; YAML would silently "
                                      "keep only the last one: remove one of them", file=self.file, key=full)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def loads(text: str, *, file: str | None = None) -> Any:
    """Parse YAML text within the limits above."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"the YAML text is {len(text):,} characters; at most {MAX_BYTES:,}", file=file)
    paths = _scan(text, file)
    loader_cls = type("BoundedLoader", (_Loader,), {"key_paths": paths, "file": file})
    loader = loader_cls(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise _malformed(exc, file) from None
    except (ValueError, OverflowError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise ConfigError(f"a value cannot be read: {str(exc).splitlines()[0][:200]}", file=file) from None
    finally:
        loader.dispose()


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def read_text(path: str | os.PathLike, *, limit: int = MAX_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes (a leading BOM is dropped)."""
    p = Path(path)
    file = str(path)
    try:
        st = os.stat(p)  # before opening: opening a FIFO would block
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{_kind(st.st_mode)}, not a regular file", file=file)
        if st.st_size > limit:
            raise ConfigError(f"the file is {st.st_size:,} bytes; at most {limit:,} are read "
                              "(is this the right file?)", file=file)
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=file) from None
    if len(data) > limit:
        raise ConfigError(f"the file is larger than {limit:,} bytes", file=file)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not a UTF-8 text file (byte {exc.start} is {data[exc.start:exc.start + 1]!r})",
                          file=file) from None
    return text.removeprefix("\ufeff")


def load_file(path: str | os.PathLike) -> Any:
    """Read and parse a YAML file within the limits above."""
    return loads(read_text(path), file=str(path))
