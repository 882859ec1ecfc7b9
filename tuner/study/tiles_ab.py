"""Serving A/B of MoE tile configs: one trial's configuration served with SGLang's own tiles and with
tuned tiles, at the same user counts of the study's workload, on this machine's GPUs.

Each variant gets a fresh server (the trial's flags and knobs, ``moe-tile-configs`` set to the
variant), the study's measurement rules (warm-up, window, the kernel warm-up before a fresh
server's first load point where the study has one) and the same seeds, so both replay the same
sessions in the same order. For the tuned variant the server log must show SGLang loading our
files (``tuner.kernels.logproof``): a run whose server fell back to its own tiles is reported as not
proven, not as a result. The load points of each variant are also what ``tuner kernels
refit-serving --default/--tuned`` reads.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner import safewrite
from tuner.backends.sglang import SGLangBackend
from tuner.backends import moe_configs
from tuner.config.knobs import SGLANG_KNOBS
from tuner.errors import ConfigError, TrialError
from tuner.evaluation.base import TrialRequest
from tuner.evaluation.live import LiveEvaluator
from tuner.kernels.logproof import prove_loaded
from tuner.study.executor import deploy_here
from tuner.study.export import _pick
from tuner.study.runner import load_existing
from tuner.sim.decode_ab import compare_server_logs
from tuner.sim.measured import METRICS, PROBE_FORMAT, extra_args_to_flags
from tuner.catalog.routing import random_weight_flags
from tuner.study.summary import study_summary
from tuner.workload.ab import WindowComparison, compare_windows, read_requests, server_spread
from tuner.workload.metrics import SPREAD_KEY

VARIANTS: tuple[str, ...] = SGLANG_KNOBS["moe-tile-configs"].choices  # default (SGLang's own), tuned


@dataclass
class VariantRun:
    tiles: str  # default | tuned
    load_points: list[dict]  # LoadPointMetrics.to_dict() per user count, in the order measured
    server_ready_s: float | None
    log_path: str | None
    tiles_loaded: bool | None = None  # tuned: the log shows our files loaded (None for default)
    tiles_proof: str = ""
    error: str | None = None  # the deployment failed (start-up or a replay); its points so far are kept
    repeat: int = 1  # the n-th server of these tiles in this A/B (an A/A pair: the same tiles twice)

    @property
    def name(self) -> str:
        return run_name(self.tiles, self.repeat)


def run_name(tiles: str, repeat: int = 1) -> str:
    """``default``, ``tuned``; ``default-2`` for the second server of the same tiles."""
    return tiles if repeat == 1 else f"{tiles}-{repeat}"


@dataclass
class TilesAB:
    study: str
    trial_number: int
    users: list[int]
    variants: list[VariantRun] = field(default_factory=list)
    spec: Any = field(default=None, repr=False)  # the study as served (probe files are made from it)
    trial: dict = field(default_factory=dict, repr=False)
    # (users, run A, run B) -> B over A with the windows' own noise, once both request files exist
    _windows: dict[tuple[int, str, str], WindowComparison | None] = field(default_factory=dict, repr=False)
    # (A's log, its size, B's log, its size) -> decode-step comparison: to_dict runs after every load
    # point, and a log that has not grown since gives the same answer
    _decode_steps: dict[tuple[str, int, str, int], dict] = field(default_factory=dict, repr=False)

    def comparison(self) -> list[dict]:
        """Per user count: each variant's P90 TPOT, P90 TTFT and output throughput, and tuned / default
        (the first server of each), each ratio with a 90% interval. Where one tiles variant was served
        twice (``same_tiles``: an A/A pair), the two servers' difference beyond their windows is the
        between-servers spread, folded into every tuned / default interval."""
        first: dict[str, VariantRun] = {}
        for v in self.variants:
            first.setdefault(v.tiles, v)
        by = {tiles: {p["users"]: p for p in v.load_points} for tiles, v in first.items()}
        same, spread = self._same_tiles(), self.server_spread()
        rows = []
        for u in self.users:
            d, t = by.get("default", {}).get(u), by.get("tuned", {}).get(u)
            row: dict[str, Any] = {"users": u}
            for name, p in (("default", d), ("tuned", t)):
                row[name] = None if p is None else {k: p.get(k) for k in (
                    "p90_tpot_s", "p50_tpot_s", "p90_ttft_s", "throughput_tokens_per_s", "requests", "valid")}
            if d and t and d.get("valid") and t.get("valid"):
                ratio = lambda k: (t[k] / d[k]) if d.get(k) and t.get(k) is not None else None
                row["tuned_over_default"] = {k: ratio(k) for k in ("p90_tpot_s", "p90_ttft_s",
                                                                   "throughput_tokens_per_s")}
                c = self._window(u, first["default"], first["tuned"])
                row["intervals"] = None if c is None else c.widened(spread).to_dict()
            pairs = {pair: per_user[u] for pair, per_user in same.items() if u in per_user}
            if pairs:
                row["same_tiles"] = {pair: c.to_dict() if c else None for pair, c in pairs.items()}
            rows.append(row)
        return rows

    def server_spread(self) -> dict[str, float]:
        """The between-servers spread of this A/B's own A/A pairs (empty without one)."""
        return server_spread(c for per_user in self._same_tiles().values() for c in per_user.values() if c)

    def _same_tiles(self) -> dict[str, dict[int, WindowComparison | None]]:
        """Every later server of a tiles variant against its first, per user count both measured."""
        out: dict[str, dict[int, WindowComparison | None]] = {}
        for v in self.variants:
            base = next(x for x in self.variants if x.tiles == v.tiles)
            if v is base:
                continue
            both = {p["users"] for p in v.load_points} & {p["users"] for p in base.load_points}
            out[f"{v.name}/{base.name}"] = {u: self._window(u, base, v) for u in self.users if u in both}
        return out

    def _window(self, users: int, a: VariantRun, b: VariantRun) -> WindowComparison | None:
        """B over A at ``users`` with the windows' own noise (``tuner.workload.ab``), from the two
        load points' request files; None where either file is missing."""
        key = (users, a.name, b.name)
        if key not in self._windows:
            fa, fb = _requests_file(a, users), _requests_file(b, users)
            self._windows[key] = compare_windows(read_requests(fa), read_requests(fb)) if fa and fb else None
        return self._windows[key]

    def decode_steps(self) -> dict[str, dict]:
        """Each later server's pure-decode steps over the first default server's, at equal batch and
        context, from the servers' own logs (``tuner.sim.decode_ab``): the kernels' share of a TPOT
        difference with the traffic taken out. ``tuned/default`` and any A/A pair."""
        base = next((v for v in self.variants if v.tiles == "default"), None)
        if base is None or not base.log_path or not Path(base.log_path).is_file():
            return {}
        out = {}
        for v in self.variants:
            if v is base or not v.log_path or not Path(v.log_path).is_file():
                continue
            key = (base.log_path, Path(base.log_path).stat().st_size, v.log_path, Path(v.log_path).stat().st_size)
            if key not in self._decode_steps:
                self._decode_steps[key] = compare_server_logs(base.log_path, v.log_path).to_dict()
            out[f"{v.name}/{base.name}"] = self._decode_steps[key]
        return out

    @property
    def proven(self) -> bool:
        tuned = [v for v in self.variants if v.tiles == "tuned"]
        return bool(tuned) and all(v.tiles_loaded for v in tuned)

    def to_dict(self) -> dict:
        return {"study": self.study, "trial_number": self.trial_number, "users": self.users,
                "variants": [asdict(v) for v in self.variants], "comparison": self.comparison(),
                "server_spread": self.server_spread(), "decode_steps": self.decode_steps(),
                "tuned_tiles_proven_loaded": self.proven}


def _requests_file(run: VariantRun, users: int) -> Path | None:
    """The request file of ``run``'s load point at ``users``, beside its server log."""
    point = next((p for p in run.load_points if p.get("users") == users), None)
    name = ((point or {}).get("extra") or {}).get("requests_file")
    if not (name and run.log_path):
        return None
    path = Path(run.log_path).parent / name
    return path if path.is_file() else None


def parse_users(text: str) -> list[int]:
    try:
        users = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{text!r} is not a comma-separated list of user counts (e.g. 16,24)",
                          key="--users") from None
    if not users or any(u < 1 for u in users):
        raise ConfigError(f"user counts must be >= 1, got {text!r}", key="--users")
    return users


def _prove(deployment) -> tuple[bool, str]:
    plan = deployment.plan
    expected = list(plan.facts.get("tile_files_expected") or [])
    dirs = [d for d in (plan.files.get("moe_config_dir"), plan.files.get("gemm_config_site")) if d]
    if not expected or not deployment.log_path or not Path(deployment.log_path).is_file():
        return False, "no tuned file was expected for this configuration, or the server left no log"
    proof = prove_loaded(deployment.log_path, expected, dirs)
    return proof.loaded, proof.summary()


def _request(spec, trial: dict, variant: str, workdir: str, name: str, run_name: str | None = None) -> TrialRequest:
    knobs = {**dict(trial.get("knobs") or {}), "moe-tile-configs": variant}
    return TrialRequest(study=spec, trial_number=int(trial["number"]), flags=dict(trial["flags"]),
                        knobs=knobs, workdir=f"{Path(workdir).resolve()}/{name}-tiles-ab/{run_name or variant}",
                        seed=spec.seed + int(trial["number"]))


def _check_tuned_files(spec, trial: dict, source: Path, key: str) -> None:
    """Refuse, before any server starts, a tuned variant whose directory holds none of the tile files
    the trial's configuration reads: its server would run SGLang's own tiles, an A/B of nothing."""
    with tempfile.TemporaryDirectory(prefix="tuner-tiles-ab-") as tmp:
        plan = SGLangBackend().build_plan(_request(spec, trial, "tuned", tmp, "plan"), Path(tmp) / "tuned")
    required = list(plan.facts.get("tile_files_required") or [])
    if required and not plan.facts.get("tile_files_expected"):
        raise ConfigError(f"{str(source)!r} holds none of the tile files trial {trial['number']}'s configuration "
                          f"reads ({', '.join(required)}): the tuned server would run SGLang's own tiles. Point "
                          f"--tuned-dir at the directory `tuner kernels tune -o` wrote", key=key)


def tiles_ab(storage: str, name: str, *, users: list[int], trial_number: int | None = None,
             workdir: str = "results/runs", variants: tuple[str, ...] = VARIANTS, progress=None,
             tuned_dir: str | None = None, on_point=None) -> TilesAB:
    """``on_point(ab)`` is called after each measured load point and each finished variant, so that a
    caller can keep what was measured when a later server is interrupted. ``tuned_dir`` overrides the
    study's ``backend_options.moe_config_dir`` (the study's stored options are those it was created
    with; a tuned directory made later is named here)."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ConfigError(f"unknown tile variant(s) {bad}; valid: {', '.join(VARIANTS)}", key="--variants")
    spec = load_existing(storage, name, notes=[])
    if spec.space().engine != "sglang":
        raise ConfigError("the tile A/B serves SGLang; this study's engine is not sglang", key="study")
    key = "--tuned-dir" if tuned_dir else "backend_options.moe_config_dir"
    if tuned_dir:
        spec = spec.model_copy(update={"backend_options": {**(spec.backend_options or {}), "moe_config_dir": tuned_dir}})
    trial = _pick(study_summary(storage, name), trial_number)
    if "tuned" in variants:  # refused before any server starts
        source = moe_configs.tuned_source_dir(spec.backend_options or {}, spec.hardware.gpu)
        if not source.is_dir():
            raise ConfigError(f"the tuned variant needs tuned tile files; {str(source)!r} does not exist (run "
                              f"`tuner kernels tune`, or set backend_options.moe_config_dir)", key=key)
        _check_tuned_files(spec, trial, source, key)
    say = progress or (lambda msg: None)
    ab = TilesAB(study=name, trial_number=int(trial["number"]), users=list(users), spec=spec, trial=trial)
    for variant in variants:
        run = VariantRun(tiles=variant, load_points=[], server_ready_s=None, log_path=None,
                         repeat=1 + sum(v.tiles == variant for v in ab.variants))
        request = _request(spec, trial, variant, workdir, name, run.name)
        say(f"{run.name} tiles: starting SGLang with trial {trial['number']}'s configuration")
        ab.variants.append(run)
        try:
            deployment = deploy_here(LiveEvaluator(SGLangBackend()), request)
        except TrialError as exc:  # the server did not start: this variant's result (bad input is raised)
            run.error = str(exc)
            say(f"{run.name} tiles: did not start ({run.error})")
            continue
        _serve_variant(ab, run, deployment, users, say, on_point)
    return ab


def _serve_variant(ab: TilesAB, run: VariantRun, deployment, users: list[int], say, on_point) -> None:
    """Measure one started variant at every user count, then close it and (tuned) prove from its log
    that SGLang loaded our files: also when interrupted, so what was measured keeps its proof."""
    run.log_path = deployment.log_path
    try:
        for u in users:
            m = deployment.measure(u)
            run.load_points.append(m.to_dict())
            if on_point:
                on_point(ab)
            say(f"{run.name} tiles at {u} users: P90 TPOT {_ms(m.p90_tpot_s)}, P90 TTFT {_ms(m.p90_ttft_s)}, "
                f"{m.throughput_tokens_per_s or 0:.0f} tok/s")
        ready = (deployment.telemetry().get("ready_after_s") or {})
        run.server_ready_s = next(iter(ready.values()), None)
    except TrialError as exc:  # the server died or hung mid-replay: keep what was measured
        run.error = str(exc)
        say(f"{run.name} tiles: stopped ({run.error})")
    finally:
        deployment.close()
        if run.tiles == "tuned":
            run.tiles_loaded, run.tiles_proof = _prove(deployment)
            say(f"tuned tiles: {run.tiles_proof}")
        if on_point:
            on_point(ab)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f} ms"


def probe_documents(ab: dict, spec, trial: dict, *, origin: str = "") -> dict[str, dict]:
    """Each server's valid load points as a ``tuner-probe/1`` document (``tuner.sim.measured``), by run
    name (``run_name``): measured after the simulator's last fit, they are the fidelity benchmark's
    out-of-sample points (``tuner bench fidelity --results DIR``). ``ab`` is ``TilesAB.to_dict()``
    (live, or read back from a committed ``-o`` file); ``spec`` and ``trial`` the study's, as
    ``tiles_ab`` served them; ``origin`` (e.g. the device call) leads each description."""
    model = spec.model.model_dump(exclude_none=True) if hasattr(spec.model, "model_dump") else spec.model
    extra_flags = {**extra_args_to_flags((spec.backend_options or {}).get("extra_server_args") or []),
                   **random_weight_flags(spec.backend_options)}
    docs = {}
    for v in ab["variants"]:
        points = []
        for i, p in enumerate(v["load_points"]):  # one server per variant: the i-th point it measured
            extra = p.get("extra") or {}
            if not p.get("valid"):
                continue
            points.append({
                "users": p["users"], "duration_s": p["duration_s"],
                "warmup_s": extra.get("warmup_s", spec.measurement.warmup_s),
                "seed": spec.seed + int(trial["number"]) + 1009 * i,
                "fresh_server": i == 0 and not extra.get("kernel_warmup"),
                "measured": {k: p.get(k) for k in METRICS},
                **({SPREAD_KEY: extra[SPREAD_KEY]} if extra.get(SPREAD_KEY) else {}),
                "server_metrics": dict(extra.get("server_metrics") or {})})
        if not points:
            continue
        run = run_name(v["tiles"], v.get("repeat", 1))
        docs[run] = {
            "format": PROBE_FORMAT, "name": f"{ab['study']}-tiles-ab-{run}",
            "description": (f"{origin}: " if origin else "") + (
                f"trial {trial['number']} of {ab['study']} served again with {v['tiles']} MoE tiles "
                "(tuner study tiles-ab)"),
            "model": model, "gpu": spec.hardware.gpu, "gpus": spec.hardware.gpus_per_node,
            "nodes": spec.hardware.nodes, "host_memory_gb": spec.hardware.host_memory_gb,
            "sglang_version": _server_version(v.get("log_path")) or (spec.backend_options or {}).get("sglang_version"),
            "flags": {**extra_flags, **dict(trial.get("flags") or {})},
            "knobs": {**dict(trial.get("knobs") or {}), "moe-tile-configs": v["tiles"]},
            "workload": spec.workload_profile().model_dump(mode="json"),
            "slo": {"p90_ttft_s": spec.slo.p90_ttft_s, "p90_tpot_s": spec.slo.p90_tpot_s},
            "points": points}
    return docs


def _server_version(log_path: str | None) -> str | None:
    """SGLang's version from the ``/server_info`` snapshot beside a server log."""
    info = Path(log_path).with_name(Path(log_path).stem + ".server_info.json") if log_path else None
    try:
        version = json.loads(info.read_text()).get("version") if info and info.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return str(version).split("-")[0] if version else None


def write_probes(docs: dict[str, dict], directory: str | Path) -> dict[str, str]:
    """``DIR/<run>.probe.json`` for each document of ``probe_documents``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for run, doc in docs.items():
        path = d / f"{run}.probe.json"
        safewrite.write_text(path, json.dumps(doc, indent=1) + "\n")
        out[run] = str(path)
    return out


def write_refit_points(ab: TilesAB, directory: str | Path) -> dict[str, str]:
    """One ``{run}.json`` per server (``run_name``; ``{"load_points": [...]}``) for ``tuner kernels
    refit-serving``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    out = {}
    for v in ab.variants:
        path = d / f"{v.name}.json"
        safewrite.write_text(path, json.dumps({"load_points": v.load_points}, indent=1) + "\n")
        out[v.name] = str(path)
    return out
