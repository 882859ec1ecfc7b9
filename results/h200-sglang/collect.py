"""Bring one device call's output into results/h200-sglang/: the study database, each trial's
--config YAML, rendered config.json, /server_info snapshot and gzipped server log, and the call's
own log. Usage: python results/h200-sglang/collect.py CALL_OUT_DIR CALL_NAME [RESULTS_DIR]
(RESULTS_DIR: where the study's database, calls/ and runs/ go; default results/h200-sglang, e.g.
results/h100-sglang for a call run with RESULTS=results/h100-sglang)"""

from __future__ import annotations

import gzip
import shutil
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


# a device call carries the whole tracked tree (64 MiB with the kit): the study's status dump, a
# copy of what the database holds, is kept gzipped
GZIPPED = {"status.json"}


def _keep(data: bytes, dest: Path) -> None:
    if dest.name in GZIPPED:
        with gzip.open(str(dest) + ".gz", "wb", compresslevel=9) as g:
            g.write(data)
    else:
        dest.write_bytes(data)


def _differs_from_kept(dest: Path, data: bytes) -> bool:
    """Whether results/ already holds this file (a log gzipped) with other content."""
    if dest.suffix == ".log":
        kept = Path(str(dest) + ".gz")
        return kept.exists() and gzip.decompress(kept.read_bytes()) != data
    return dest.exists() and dest.read_bytes() != data


def main(out_dir: str, call: str, results_dir: str | None = None) -> None:
    src = Path(out_dir)
    root = Path(results_dir).resolve() if results_dir else HERE
    calls = root / "calls" / call
    calls.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix == ".db":
            for side in ("-wal", "-shm"):  # a local reader's leftovers would be replayed onto the new file
                (root / (f.name + side)).unlink(missing_ok=True)
            shutil.copyfile(f, root / f.name)
        elif f.suffix in (".log", ".csv", ".json", ".yaml", ".txt") and f.is_file():
            _keep(f.read_bytes(), calls / f.name)
    # the call's small files, packed (a call returns at most 8 files): call-logs-<study>.tgz, one per
    # study the call ran (each into its own folder when there are several), or call-logs.tgz
    packs = sorted(src.glob("call-logs*.tgz"))
    for logs in packs:
        study = logs.name[len("call-logs-"):-len(".tgz")] if logs.name.startswith("call-logs-") else ""
        dest = calls / study if study and len(packs) > 1 else calls
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(logs) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    _keep(tar.extractfile(m).read(), dest / Path(m.name).name)
    for tgz in [*src.glob("runs-*.tgz"), *src.glob("runs.tgz")]:
        with tarfile.open(tgz) as tar:
            for m in tar.getmembers():
                if not m.isfile():
                    continue
                rel = Path(m.name)
                if rel.name.endswith(".pids.json"):
                    continue
                data = tar.extractfile(m).read()
                dest = root / "runs" / rel
                if _differs_from_kept(dest, data):
                    # an earlier call's file of the same trial and variant (a repeated A/B): keep both
                    dest = calls / "runs" / rel
                    print(f"kept beside the earlier call's file: {dest.relative_to(root)}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                if rel.suffix == ".log":
                    with gzip.open(str(dest) + ".gz", "wb", compresslevel=9) as g:
                        g.write(data)
                else:
                    dest.write_bytes(data)
    cache = src / "triton-cache.tar.xz"  # the next call restores it (carry .jitcache)
    if cache.exists():
        jit = HERE.parent.parent / ".jitcache"
        jit.mkdir(exist_ok=True)
        shutil.copyfile(cache, jit / cache.name)
    planner = src / "planner.tgz"  # planner probes: results/h200-planner/<name>.json, <name>.log.gz
    if planner.exists():
        with tarfile.open(planner) as tar:
            for m in tar.getmembers():
                rel = Path(m.name)
                if m.isfile() and rel.parts[0] == "h200-planner" and ".." not in rel.parts:
                    dest = HERE.parent / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(tar.extractfile(m).read())
    print(f"collected {src} -> {root} (call {call})")


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    main(*sys.argv[1:4])
