"""Prove from a server log that SGLang loaded our tile files (pure CPU).

SGLang logs one line per config file it resolves (``sglang_layout.LOG_PATTERNS``): the file it uses,
a fallback to another Triton version's file, or the "Using default ... Performance might be
sub-optimal!" warning. A trial's tiles are proven loaded when, for every file we expect, the log
names that file inside our directory, and no default or fallback warning is left for those shapes.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path

from tuner.errors import ConfigError
from tuner.kernels.sglang_layout import LOG_PATTERNS


@dataclass
class LogEvent:
    kind: str  # a LOG_PATTERNS key
    line_number: int
    path: str | None  # the file loaded (found / fallback)
    wanted: str | None  # the file SGLang looked for and did not find (default / fallback / down reuse)


@dataclass
class LoadProof:
    loaded: bool
    expected: list[str]
    loaded_ours: dict[str, int] = field(default_factory=dict)  # file name -> first line naming it in our dir
    missing: list[str] = field(default_factory=list)  # expected names never loaded from our dir
    warnings: list[LogEvent] = field(default_factory=list)  # default/fallback/reuse for expected names
    other_warnings: list[LogEvent] = field(default_factory=list)  # the same for shapes we did not tune

    def summary(self) -> str:
        if self.loaded:
            return (f"SGLang loaded all {len(self.expected)} tuned file(s) from our directory; no default-config "
                    f"warning for them")
        parts = []
        if self.missing:
            parts.append(f"not loaded from our directory: {', '.join(self.missing)}")
        if self.warnings:
            parts.append("warnings: " + "; ".join(f"line {w.line_number}: {w.kind} ({Path(w.wanted or w.path or '').name})"
                                                   for w in self.warnings))
        return "; ".join(parts) or "nothing expected"


def scan_log(text: str) -> list[LogEvent]:
    events = []
    for i, line in enumerate(text.splitlines(), 1):
        for kind, pattern in LOG_PATTERNS.items():
            m = pattern.search(line.rstrip())
            if m:
                g = m.groupdict()
                events.append(LogEvent(kind, i, g.get("path"), g.get("wanted")))
                break
    return events


def _inside(path: str, roots: list[Path]) -> bool:
    p = os.path.normpath(path)
    return any(p == str(r) or p.startswith(str(r) + os.sep) for r in roots)


def prove_loaded(log: str | Path, expected_files: list[str], our_dirs: list[str | Path]) -> LoadProof:
    """Did the server whose log is ``log`` (text or a file) load every name in ``expected_files`` from
    one of ``our_dirs``, with no default/fallback warning left for them?"""
    if isinstance(log, Path) or (isinstance(log, str) and "\n" not in log and len(log) < 4096 and Path(log).is_file()):
        path = Path(log)
        try:
            if path.suffix == ".gz":  # committed server logs are gzipped
                with gzip.open(path, "rt", errors="replace") as f:
                    text = f.read()
            else:
                text = path.read_text(errors="replace")
        except (OSError, EOFError) as exc:
            raise ConfigError(f"cannot read server log ({exc})", file=str(path)) from None
    else:
        text = str(log)
    if not expected_files:
        raise ConfigError("no expected tile file names to look for", key="expected_files")
    roots = [Path(os.path.normpath(os.path.abspath(d))) for d in our_dirs]
    names = [Path(n).name for n in expected_files]
    events = scan_log(text)
    proof = LoadProof(loaded=False, expected=names)
    for ev in events:
        if ev.kind in ("moe_found", "gemm_found") and ev.path and Path(ev.path).name in names:
            if _inside(ev.path, roots):
                proof.loaded_ours.setdefault(Path(ev.path).name, ev.line_number)
        elif ev.kind in ("moe_default", "gemm_default", "moe_fallback", "moe_down_reuse"):
            (proof.warnings if Path(ev.wanted or "").name in names else proof.other_warnings).append(ev)
    proof.missing = [n for n in names if n not in proof.loaded_ours]
    proof.loaded = not proof.missing and not proof.warnings
    return proof
