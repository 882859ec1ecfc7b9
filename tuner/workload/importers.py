"""Readers of real request traces into the normalized :class:`~tuner.workload.trace.Trace`.

Formats (``FORMATS``):
  jsonl           tuner's own session log, one request per line (docs/workload.md)
  mooncake        Mooncake FAST'25 traces: {timestamp (ms), input_length, output_length, hash_ids}
  azure           Azure LLM inference CSV: TIMESTAMP,ContextTokens,GeneratedTokens
  weka-csv        per-request Claude Code CSV: trace,agent,turn,t_s,input_tokens,output_tokens,...
  kvcache-tester  kv-cache-tester session JSON ({block_size, requests: [{t, in, out, hash_ids}]}),
                  one file or a directory of them
  sharegpt        ShareGPT multi-turn JSON ([{conversations: [{from, value}]}]); lengths estimated

Every reader fails on the first bad record with its file and line (ConfigError, exit 2) unless
``skip_bad`` is set, in which case bad records are skipped and counted in ``Trace.skipped_lines``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from datetime import datetime
from pathlib import Path

from tuner.errors import ConfigError
from tuner.workload.trace import Trace, TraceRequest

FORMATS = ("jsonl", "mooncake", "azure", "weka-csv", "kvcache-tester", "sharegpt")
# CSV formats: (required columns, optional columns); names match case-insensitively
CSV_COLUMNS = {
    "azure": (("TIMESTAMP", "ContextTokens", "GeneratedTokens"), ()),
    "weka-csv": (("trace", "agent", "turn", "input_tokens", "output_tokens"),
                 ("t_s", "think_time_s", "prefix_hit_tokens", "api_time_s", "stop")),
}
BOM = "\ufeff"
MOONCAKE_BLOCK_SIZE = 512
SHAREGPT_CHARS_PER_TOKEN = 4.0  # rough English average for BPE tokenizers


class _BadRecord(ValueError):
    pass


def load_trace(path: str | os.PathLike, fmt: str | None = None, *, skip_bad: bool = False) -> Trace:
    """Read ``path`` (format auto-detected unless ``fmt`` is given) into a normalized Trace."""
    path = Path(path)
    if not path.exists():
        raise ConfigError("no such file or directory", file=str(path))
    if path.is_file():
        _check_encoding(path)
    if fmt is None:
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown trace format {fmt!r}; valid formats: {', '.join(FORMATS)}", file=str(path))
    reader = _READERS[fmt]
    trace = reader(path, skip_bad)
    if not trace.requests:
        extra = f" ({trace.skipped_lines} bad records skipped)" if trace.skipped_lines else ""
        raise ConfigError(f"no requests found in {fmt} trace{extra}", file=str(path))
    return trace


_OTHER_BOMS = {b"\xff\xfe\x00\x00": "UTF-32 (little-endian)", b"\x00\x00\xfe\xff": "UTF-32 (big-endian)",
               b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}


def _check_encoding(path: Path) -> None:
    """Traces are UTF-8 (a UTF-8 byte-order mark is fine and skipped); say so for UTF-16/32."""
    with open(path, "rb") as f:
        start = f.read(4)
    for mark, name in _OTHER_BOMS.items():
        if start.startswith(mark):
            raise ConfigError(f"line 1: the file is {name} text (it starts with the byte-order mark "
                              f"{mark.hex(' ').upper()}); traces must be UTF-8: convert it, e.g. "
                              f"`iconv -f UTF-16 -t UTF-8`", file=str(path))


def detect_format(path: Path) -> str:
    """Guess the format from the extension and the first record."""
    if path.is_dir():
        if any(path.glob("*.json")):
            return "kvcache-tester"
        raise ConfigError("directory holds no *.json session files", file=str(path))
    head = _head(path).removeprefix(BOM)
    if not head.strip():
        raise ConfigError("file is empty", file=str(path))
    suffix = path.suffix.lower()
    first = head.lstrip().splitlines()[0] if head.strip() else ""
    if suffix == ".csv" or (not first.startswith(("{", "[")) and "," in first):
        cols = {c.strip().strip('"').lower() for c in first.split(",")}
        overlap = {fmt: len(cols & {c.lower() for c in req}) for fmt, (req, _) in CSV_COLUMNS.items()}
        best = max(overlap, key=overlap.get)
        if overlap[best] >= 2:  # the closest format; its reader names any missing column
            return best
        raise ConfigError(
            f"line 1: unrecognised CSV header {first[:200]!r}; expected the columns of "
            + " or of ".join(f"{fmt} ({', '.join(req)})" for fmt, (req, _) in CSV_COLUMNS.items())
            + "; pass --format",
            file=str(path),
        )
    stripped = head.lstrip()
    if stripped.startswith("["):
        return "sharegpt"
    if stripped.startswith("{"):
        try:
            first_obj = json.loads(first)
        except json.JSONDecodeError:
            first_obj = None  # a pretty-printed JSON document, not JSON lines
        if isinstance(first_obj, dict):
            if "input_length" in first_obj and "hash_ids" in first_obj:
                return "mooncake"
            if "input_tokens" in first_obj:
                return "jsonl"
        if '"requests"' in head and '"block_size"' in head:
            return "kvcache-tester"
        if '"conversations"' in head:
            return "sharegpt"
    raise ConfigError(f"cannot tell the trace format; pass --format (one of {', '.join(FORMATS)})", file=str(path))


def _head(path: Path, n: int = 65536) -> str:
    with open(path, "rb") as f:
        return f.read(n).decode("utf-8", errors="replace")


def _int_field(obj: dict, key: str, *, minimum: int = 0, required: bool = True) -> int | None:
    if key not in obj or obj[key] is None or obj[key] == "":
        if required:
            raise _BadRecord(f"missing {key!r}")
        return None
    try:
        value = float(obj[key])
    except (TypeError, ValueError):
        raise _BadRecord(f"{key!r} is not a number: {obj[key]!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise _BadRecord(f"{key!r} is not a whole number: {obj[key]!r}")
    if value < minimum:
        raise _BadRecord(f"{key!r} is {int(value)}, must be >= {minimum}")
    return int(value)


def _float_field(obj: dict, key: str, *, required: bool = False, minimum: float | None = 0.0) -> float | None:
    if key not in obj or obj[key] is None or obj[key] == "":
        if required:
            raise _BadRecord(f"missing {key!r}")
        return None
    try:
        value = float(obj[key])
    except (TypeError, ValueError):
        raise _BadRecord(f"{key!r} is not a number: {obj[key]!r}") from None
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise _BadRecord(f"{key!r} is {obj[key]!r}, must be a finite number >= {minimum}")
    return value


def _hash_list(obj: dict, key: str) -> tuple[int, ...] | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(h, int) for h in v):
        raise _BadRecord(f"{key!r} must be a list of integers")
    return tuple(v)


class _Records:
    """Iterates (line_no, record) and turns _BadRecord into ConfigError or a skip count."""

    def __init__(self, path: Path, skip_bad: bool):
        self.path, self.skip_bad, self.skipped = path, skip_bad, 0

    def bad(self, line_no: int, why: str):
        if self.skip_bad:
            self.skipped += 1
            return
        raise ConfigError(f"line {line_no}: {why} (use --skip-bad to skip bad lines)", file=str(self.path))

    def json_lines(self):
        with open(self.path, encoding="utf-8-sig", errors="replace") as f:  # -sig: a leading BOM is dropped
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    self.bad(line_no, f"not valid JSON ({exc.msg})")
                    continue
                if not isinstance(obj, dict):
                    self.bad(line_no, "expected a JSON object")
                    continue
                yield line_no, obj

    def csv_rows(self, fmt: str):
        required, optional = CSV_COLUMNS[fmt]
        with open(self.path, encoding="utf-8-sig", errors="replace", newline="") as f:  # -sig: BOM dropped
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise ConfigError("file is empty", file=str(self.path))
            canonical = {c.lower(): c for c in (*required, *optional)}
            header = [canonical.get(h.strip().lower(), h.strip()) for h in header]
            needs = (f"a {fmt} trace needs the columns {', '.join(required)}"
                     + (f" (optional: {', '.join(optional)})" if optional else ""))
            dupes = sorted({h for h in header if header.count(h) > 1})
            if dupes:
                raise ConfigError(f"line 1 (the header): column(s) {', '.join(map(repr, dupes))} appear more than "
                                  f"once; {needs}", file=str(self.path))
            missing = [c for c in required if c not in header]
            if missing:
                raise ConfigError(f"line 1 (the header): missing column(s) {', '.join(map(repr, missing))}; "
                                  f"{needs}; found: {', '.join(h or '(empty)' for h in header)}",
                                  file=str(self.path))
            for row in reader:
                line_no = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    self.bad(line_no, f"expected {len(header)} fields, found {len(row)}")
                    continue
                yield line_no, dict(zip(header, (c.strip() for c in row)))


# --- tuner JSONL ---------------------------------------------------------------------------------


def _read_jsonl(path: Path, skip_bad: bool) -> Trace:
    recs = _Records(path, skip_bad)
    out, block_size, prefix = [], None, None
    for line_no, obj in recs.json_lines():
        try:
            sid = obj.get("session_id")
            if sid is None or sid == "":
                raise _BadRecord("missing 'session_id'")
            req = TraceRequest(
                session_id=str(sid),
                turn=_int_field(obj, "turn"),
                input_tokens=_int_field(obj, "input_tokens", minimum=1),
                output_tokens=_int_field(obj, "output_tokens"),
                timestamp_s=_float_field(obj, "timestamp_s", minimum=None),
                think_time_s=_float_field(obj, "think_time_s"),
                hash_ids=_hash_list(obj, "hash_ids"),
                prefix_hit_tokens=_int_field(obj, "prefix_hit_tokens", required=False),
                agent=obj.get("agent"),
            )
            bs = _int_field(obj, "block_size", minimum=1, required=False)
            if bs is not None:
                if block_size is not None and bs != block_size:
                    raise _BadRecord(f"'block_size' {bs} differs from earlier lines ({block_size})")
                block_size = bs
            if req.hash_ids is not None and bs is None and block_size is None:
                raise _BadRecord("'hash_ids' needs 'block_size' (tokens per hash)")
            sp = _int_field(obj, "system_prefix_tokens", required=False)
            if sp is not None:
                prefix = sp
        except _BadRecord as exc:
            recs.bad(line_no, str(exc))
            continue
        out.append(req)
    return Trace(out, "jsonl", str(path), block_size=block_size, system_prefix_tokens=prefix, skipped_lines=recs.skipped)


# --- Mooncake ------------------------------------------------------------------------------------


def _read_mooncake(path: Path, skip_bad: bool) -> Trace:
    recs = _Records(path, skip_bad)
    rows = []
    for line_no, obj in recs.json_lines():
        try:
            hashes = _hash_list(obj, "hash_ids")
            if hashes is None:
                raise _BadRecord("missing 'hash_ids'")
            rows.append((
                _float_field(obj, "timestamp", required=True, minimum=None) / 1000.0,
                _int_field(obj, "input_length", minimum=1),
                _int_field(obj, "output_length"),
                hashes,
            ))
        except _BadRecord as exc:
            recs.bad(line_no, str(exc))
    requests = _sessions_from_hash_chains(rows, MOONCAKE_BLOCK_SIZE)
    trace = Trace(requests, "mooncake", str(path), block_size=MOONCAKE_BLOCK_SIZE, skipped_lines=recs.skipped)
    trace.notes.append("sessions inferred from hash chains: a request continues the latest earlier request "
                       "whose full prompt blocks are a prefix of its own")
    return trace


def _sessions_from_hash_chains(rows, block_size: int) -> list[TraceRequest]:
    """Link each request to the conversation it continues.

    A follow-up turn re-sends the previous prompt, so the previous request's *full* blocks (the
    last, partial block changes once more tokens follow it) are a prefix of its hash list. The
    deepest such earlier request that has no continuation yet is taken as the previous turn.
    """
    root: dict = {}  # trie node: {"c": children, "r": index of the request ending its full blocks here}
    session_of, turn_of, has_child = [], [], []
    out = []
    n_sessions = 0
    for i, (ts, n_in, n_out, hashes) in enumerate(sorted(rows, key=lambda r: r[0])):
        node, parent = root, None
        for h in hashes:
            node = node.get("c", {}).get(h)
            if node is None:
                break
            r = node.get("r")
            if r is not None and not has_child[r]:
                parent = r
        if parent is None:
            session_of.append(n_sessions)
            turn_of.append(0)
            n_sessions += 1
        else:
            has_child[parent] = True
            session_of.append(session_of[parent])
            turn_of.append(turn_of[parent] + 1)
        has_child.append(False)
        full = min(len(hashes), n_in // block_size)
        node = root
        for h in hashes[:full]:
            node = node.setdefault("c", {}).setdefault(h, {})
        if full:
            node["r"] = i
        out.append(TraceRequest(
            session_id=str(session_of[i]), turn=turn_of[i], input_tokens=n_in, output_tokens=n_out,
            timestamp_s=ts, hash_ids=hashes,
        ))
    return out


# --- Azure ---------------------------------------------------------------------------------------


def _parse_azure_time(s: str) -> float:
    # "2023-11-16 18:17:03.9799600": seven fractional digits, more than datetime accepts.
    if "." in s:
        main, frac = s.split(".", 1)
        s = f"{main}.{frac[:6]}"
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        raise _BadRecord(f"TIMESTAMP {s!r} is not a date-time") from None


def _read_azure(path: Path, skip_bad: bool) -> Trace:
    recs = _Records(path, skip_bad)
    out, t0 = [], None
    for line_no, row in recs.csv_rows("azure"):
        try:
            ts = _parse_azure_time(row["TIMESTAMP"])
            t0 = ts if t0 is None else min(t0, ts)
            out.append(TraceRequest(
                session_id=f"r{len(out)}", turn=0,
                input_tokens=_int_field(row, "ContextTokens", minimum=1),
                output_tokens=_int_field(row, "GeneratedTokens"),
                timestamp_s=ts,
            ))
        except _BadRecord as exc:
            recs.bad(line_no, str(exc))
    out = [TraceRequest(**{**r.__dict__, "timestamp_s": r.timestamp_s - t0}) for r in out]
    trace = Trace(out, "azure", str(path), skipped_lines=recs.skipped)
    trace.notes.append("no sessions or prefixes in this format: every request is its own session")
    return trace


# --- Claude Code request CSV ---------------------------------------------------------------------


def _read_weka_csv(path: Path, skip_bad: bool) -> Trace:
    recs = _Records(path, skip_bad)
    out = []
    for line_no, row in recs.csv_rows("weka-csv"):
        try:
            if not row["trace"] or not row["agent"]:
                raise _BadRecord("empty 'trace' or 'agent'")
            out.append(TraceRequest(
                session_id=f"{row['trace']}/{row['agent']}",
                turn=_int_field(row, "turn"),
                input_tokens=_int_field(row, "input_tokens", minimum=1),
                output_tokens=_int_field(row, "output_tokens"),
                timestamp_s=_float_field(row, "t_s", minimum=None),
                think_time_s=_float_field(row, "think_time_s"),
                prefix_hit_tokens=_int_field(row, "prefix_hit_tokens", required=False),
                agent=row["agent"],
            ))
        except _BadRecord as exc:
            recs.bad(line_no, str(exc))
    trace = Trace(out, "weka-csv", str(path), skipped_lines=recs.skipped)
    trace.notes.append("session = (trace, agent): the main agent and each sub-agent (main.saN) are separate sessions")
    return trace


# --- kv-cache-tester session JSON ----------------------------------------------------------------


def _read_kvcache_tester(path: Path, skip_bad: bool) -> Trace:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    out, block_size, prefixes, skipped = [], None, [], 0
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8-sig"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if skip_bad:
                skipped += 1
                continue
            raise ConfigError(f"not valid JSON ({exc})", file=str(f)) from None
        if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
            if skip_bad:
                skipped += 1
                continue
            raise ConfigError("expected a JSON object with a 'requests' list", file=str(f), key="requests")
        bs = doc.get("block_size")
        if not isinstance(bs, int) or bs <= 0:
            raise ConfigError(f"'block_size' must be a positive integer, got {bs!r}", file=str(f), key="block_size")
        if block_size is not None and bs != block_size:
            raise ConfigError(f"block_size {bs} differs from other files ({block_size})", file=str(f), key="block_size")
        block_size = bs
        if isinstance(doc.get("system_tokens"), int) and isinstance(doc.get("tool_tokens"), int):
            prefixes.append(doc["system_tokens"] + doc["tool_tokens"])
        trace_id = doc.get("id") or f.stem
        agents: dict[str, int] = {}

        def add(req: dict, agent: str, t0: float, where: str):
            nonlocal skipped
            try:
                turn = agents.get(agent, 0)
                out.append(TraceRequest(
                    session_id=f"{trace_id}/{agent}", turn=turn,
                    input_tokens=_int_field(req, "in", minimum=1),
                    output_tokens=_int_field(req, "out"),
                    timestamp_s=t0 + (_float_field(req, "t", required=True) or 0.0),
                    think_time_s=_float_field(req, "think_time"),
                    hash_ids=_hash_list(req, "hash_ids"),
                    agent=agent,
                ))
                agents[agent] = turn + 1
            except _BadRecord as exc:
                if skip_bad:
                    skipped += 1
                    return
                raise ConfigError(f"{where}: {exc}", file=str(f)) from None

        for i, req in enumerate(doc["requests"]):
            if not isinstance(req, dict):
                add({}, "main", 0.0, f"requests[{i}]")
                continue
            if req.get("type") == "subagent":
                t0 = float(req.get("t") or 0.0)
                agent = str(req.get("agent_id") or f"sa{i}")
                for j, sub in enumerate(req.get("requests") or []):
                    add(sub if isinstance(sub, dict) else {}, agent, t0, f"requests[{i}].requests[{j}]")
            else:
                add(req, "main", 0.0, f"requests[{i}]")
    prefix = int(sorted(prefixes)[len(prefixes) // 2]) if prefixes else None
    trace = Trace(out, "kvcache-tester", str(path), block_size=block_size, system_prefix_tokens=prefix,
                  skipped_lines=skipped)
    trace.notes.append("hash ids are scoped to one session file; sub-agents are separate sessions")
    return trace


# --- ShareGPT ------------------------------------------------------------------------------------

_USER_ROLES = {"human", "user"}
_ASSISTANT_ROLES = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


def _estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / SHAREGPT_CHARS_PER_TOKEN))


def _read_sharegpt(path: Path, skip_bad: bool) -> Trace:
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid JSON ({exc})", file=str(path)) from None
    if not isinstance(doc, list):
        raise ConfigError("expected a JSON list of conversations", file=str(path))
    out, skipped = [], 0
    for i, conv in enumerate(doc):
        try:
            msgs = conv.get("conversations") if isinstance(conv, dict) else None
            if not isinstance(msgs, list):
                raise _BadRecord("missing 'conversations' list")
            sid = str(conv.get("id", i))
            context, turn = 0, 0
            for j, m in enumerate(msgs):
                if not isinstance(m, dict) or not isinstance(m.get("value"), str):
                    raise _BadRecord(f"conversations[{j}] needs 'from' and a string 'value'")
                n = _estimate_tokens(m["value"])
                role = str(m.get("from", "")).lower()
                nxt = msgs[j + 1] if j + 1 < len(msgs) else None
                if role in _USER_ROLES and isinstance(nxt, dict) and str(nxt.get("from", "")).lower() in _ASSISTANT_ROLES:
                    out.append(TraceRequest(session_id=sid, turn=turn, input_tokens=context + n,
                                            output_tokens=_estimate_tokens(str(nxt.get("value", "")))))
                    turn += 1
                context += n
        except _BadRecord as exc:
            if skip_bad:
                skipped += 1
                continue
            raise ConfigError(f"conversation [{i}]: {exc}", file=str(path)) from None
    trace = Trace(out, "sharegpt", str(path), skipped_lines=skipped)
    trace.notes.append(f"token counts estimated as characters / {SHAREGPT_CHARS_PER_TOKEN:g}")
    return trace


_READERS = {
    "jsonl": _read_jsonl,
    "mooncake": _read_mooncake,
    "azure": _read_azure,
    "weka-csv": _read_weka_csv,
    "kvcache-tester": _read_kvcache_tester,
    "sharegpt": _read_sharegpt,
}
