"""Read Triton's on-disk kernel cache: which kernel an entry holds, and how two entries of one kernel
differ (CPU; no triton import).

Triton writes one folder per compiled binary, named by the hash of everything that selects it
(source, constexprs, argument specialisations, options). Two processes that build "the same" config
into two folders differ somewhere in that key; the IR of each entry (``.ttir``) names the argument
specialisations (``tt.divisibility``) and the constants, and its metadata JSON the options, so a
diff of the two says what differs.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path


def entry_names(cache_dir: str | os.PathLike) -> set[str]:
    """The entry folders of a cache directory (empty when it does not exist)."""
    try:
        with os.scandir(cache_dir) as it:
            return {e.name for e in it}
    except OSError:
        return set()


def kernel_name(entry: Path) -> str:
    """The kernel a cache entry holds (its metadata file's stem), or '?'."""
    try:
        names = [f.stem for f in entry.iterdir() if f.suffix == ".json" and not f.name.startswith("__grp__")]
    except OSError:
        return "?"
    return names[0] if names else "?"


def ir_lines(entry: Path) -> list[str]:
    """The entry's first-stage IR (``.ttir``; else the source or ``.ttgir``), as lines."""
    for suffix in (".ttir", ".source", ".ttgir"):
        files = sorted(entry.glob(f"*{suffix}"))
        if files:
            return files[0].read_text(errors="replace").splitlines()
    return []


def _metadata(entry: Path, kernel: str) -> list[str]:
    path = entry / f"{kernel}.json"
    return path.read_text(errors="replace").split(",") if path.is_file() else []


def twin_diff(cache_dir: str | os.PathLike, entry: str, others: set[str] | None = None,
              max_lines: int = 12) -> list[str]:
    """How ``entry`` differs from the nearest entry of the same kernel among ``others`` (default:
    every other entry): the IR lines that differ, then the metadata fields that differ. Empty when
    no other entry holds that kernel."""
    root = Path(cache_dir)
    mine = root / entry
    kernel = kernel_name(mine)
    pool = sorted((others if others is not None else entry_names(root)) - {entry})
    twins = [root / n for n in pool if kernel_name(root / n) == kernel]
    if not twins:
        return []
    ir = ir_lines(mine)

    def changed(a: list[str], b: list[str]) -> list[str]:
        return [ln for ln in difflib.unified_diff(a, b, "other", "this", n=0, lineterm="")
                if not ln.startswith(("---", "+++", "@@"))]

    best = min(twins, key=lambda t: (len(changed(ir_lines(t), ir)), t.name))
    ir_diff = changed(ir_lines(best), ir)
    meta_diff = changed(_metadata(best, kernel), _metadata(mine, kernel))
    out = [f"{kernel}: {entry[:12]} against {best.name[:12]} ({len(twins)} other entries of the kernel)"]
    out += ["  IR " + ln for ln in ir_diff[:max_lines]] or ["  IR identical"]
    out += ["  metadata " + ln for ln in meta_diff[:max_lines]] or ["  metadata identical"]
    return out
