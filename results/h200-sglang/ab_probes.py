"""Probe files (``tuner-probe/1``) from a committed tile A/B call, for the fidelity benchmark: each
variant's load points with the study's configuration as `tuner study tiles-ab --probes` writes them
on the GPU machine (calls before that option existed get theirs here).

    python results/h200-sglang/ab_probes.py calls/30-dsv3-tiles-ab-16-users [...]

Reads CALL/tiles-ab.json and the study's database beside this file; writes CALL/<variant>.probe.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tuner.study.export import _pick
from tuner.study.runner import load_existing
from tuner.study.summary import study_summary
from tuner.study.tiles_ab import probe_documents, write_probes

HERE = Path(__file__).resolve().parent


def _committed(device_log: str | None, call: Path) -> str | None:
    """A server log's path on the GPU machine (.../results/runs/REL) as collect.py kept it here:
    CALL/runs/REL where an earlier call's file held the place, else runs/REL."""
    if not device_log or "/results/runs/" not in device_log:
        return device_log
    rel = device_log.split("/results/runs/", 1)[1]
    kept = call / "runs" / rel
    return str(kept if kept.with_name(kept.stem + ".server_info.json").exists() else HERE / "runs" / rel)


def main(call_dirs: list[str]) -> None:
    for name in call_dirs:
        call = Path(name) if Path(name).is_absolute() or Path(name).exists() else HERE / name
        ab = json.loads((call / "tiles-ab.json").read_text())
        storage = f"sqlite:///{HERE / (ab['study'] + '.db')}"
        spec = load_existing(storage, ab["study"], notes=[])
        trial = _pick(study_summary(storage, ab["study"]), ab["trial_number"])
        for v in ab["variants"]:
            v["log_path"] = _committed(v.get("log_path"), call)
        docs = probe_documents(ab, spec, trial, origin=call.name)
        for tiles, path in write_probes(docs, call).items():
            print(f"{tiles}: {Path(path).relative_to(HERE)}")


if __name__ == "__main__":
    main(sys.argv[1:])
