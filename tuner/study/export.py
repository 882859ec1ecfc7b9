"""Export a trial's configuration as YAML that SGLang reads with ``--config``.

The body comes from the SGLang backend's own config writer, so what a trial ran and what is
exported are the same mapping, checked against the flag set of the SGLang version the user
deploys (``--sglang-version``, default 0.5.23): a flag that version lacks is refused with what it
offers instead, and a flag its ``--config`` parser refuses goes into the launch command. The
header comments say where it came from and how to launch it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

import tuner
from tuner import safewrite
from tuner.backends.moe_configs import (build_trial_moe_dir, installed_sglang_config_root, tuned_gemm_files,
                                        tuned_source_dir)
from tuner.backends.router import plan_topology
from tuner.backends.sglang import (
    checkpoint_for, config_to_argv, config_yaml_dict, pinned_server_flags, render_config_yaml,
)
from tuner.catalog import get_gpu, get_model, model_label
from tuner.catalog.sglang_flags import load_flagset, resolve_version
from tuner.kernels.configfile import read_configs
from tuner.kernels.sglang_layout import layout_for
from tuner.vocabulary import LoadFormat
from tuner.errors import ConfigError, StudyNotFoundError
from tuner.lifecycle import TrialStatus
from tuner.study.runner import load_existing
from tuner.study.summary import study_summary
from tuner.vocabulary import Engine



def _pick(summary: dict, trial_number: int | None) -> dict:
    if trial_number is None:
        if summary["best"] is None:
            raise StudyNotFoundError(f"study {summary['name']!r} has no completed trial to export yet")
        return summary["best"]
    for t in summary["trials"]:
        if t["number"] == trial_number:
            if t["status"] != TrialStatus.COMPLETE:
                raise ConfigError(f"trial {trial_number} did not complete ({t['status']}); nothing to export",
                                  key="--trial")
            return t
    raise ConfigError(f"study {summary['name']!r} has no trial {trial_number}", key="--trial")


def _ship_gemm_tiles(files: list[Path], source: Path, output: str | None, version: str,
                     notes: list[str]) -> list[str]:
    """Copy tuned fp8 block GEMM tiles beside the export; header lines saying where SGLang reads them."""
    if not files:
        return []
    subdir = f"sglang/{layout_for(version).gemm_config_subdir}"
    if output:
        dest = Path(output).parent / (Path(output).stem + "-gemm")
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            safewrite.write_text(dest / f.name, f.read_text())
        notes.append(f"copied {len(files)} tuned fp8 GEMM tile file(s) to {dest}")
        where = f"{dest.name}/*.json"
    else:
        where = f"the {len(files)} GEMM file(s) under {source}"
    return [f"fp8 block GEMM tiles: tuned; SGLang {version} reads them only from its own package: copy {where} "
            f"into <site-packages>/{subdir}/ (no environment variable names that directory)"]


def export_study(storage: str, name: str, *, output: str | None = None,
                 trial_number: int | None = None, sglang_version: str | None = None) -> tuple[str, list[str]]:
    """(YAML text, notes for the user). Writes ``output`` (and tuned MoE files beside it) if given."""
    if output is not None:
        safewrite.check_target(output)  # before anything is read or copied
    summary = study_summary(storage, name)
    notes: list[str] = []
    spec = load_existing(storage, name, notes=notes)  # a value today's schema refuses: its default, noted
    trial = _pick(summary, trial_number)
    engine = spec.space().engine
    at = trial.get("at_capacity") or {}
    header = [
        f"SGLang server configuration exported by tuner {tuner.__version__}",
        f"study: {name} (model {spec.model}, {spec.hardware.nodes}x{spec.hardware.gpus_per_node} {spec.hardware.gpu})",
        f"trial: {trial['number']}{' (baseline)' if trial['is_baseline'] else ''}, backend: {trial['backend_kind']}",
        f"capacity: {trial['capacity_users']} concurrent users within P90 TTFT <= {spec.slo.p90_ttft_s} s "
        f"and P90 TPOT <= {spec.slo.p90_tpot_s * 1000:.0f} ms",
    ]
    if at:
        header.append(f"at {at['users']} users: P90 TTFT {at['p90_ttft_s']:.2f} s, P90 TPOT "
                      f"{at['p90_tpot_s'] * 1000:.1f} ms, {at['throughput_tokens_per_s']:.0f} output tokens/s")
    base = summary.get("baseline")
    if base and base.get("capacity_users") is not None and not trial["is_baseline"]:
        header.append(f"baseline (trial {base['number']}): {base['capacity_users']} users")
    why = trial.get("bottleneck") or {}
    if why.get("sentence"):
        header.append(f"bottleneck: {why['sentence']}")
    if why.get("not_measured"):
        header.append("not measured: " + "; ".join(m["title"] for m in why["not_measured"]))

    if engine != Engine.SGLANG:
        body = yaml.safe_dump({**trial["flags"]}, sort_keys=True)
        header.append(f"engine: {engine} (these are its server flags)")
        text = "".join(f"# {h}\n" for h in header) + body
        _write(output, text)
        return text, notes

    fs = load_flagset(resolve_version(sglang_version, key="--sglang-version"))
    model = get_model(spec.model)
    flags = {**pinned_server_flags(spec.backend_options), **dict(trial["flags"])}
    knobs = dict(trial["knobs"])
    missing = [k for k in flags if k not in fs]
    if missing:
        raise ConfigError("; ".join(f"--{k} is not a flag of SGLang {fs.version}{fs.suggest(k)}" for k in missing)
                          + f" (trial {trial['number']} ran it; export for another version with --sglang-version)",
                          key="--sglang-version")
    model_path, _ = checkpoint_for(model, flags.get("quantization"), spec.backend_options)
    ran_on = trial.get("sglang_version")
    header.insert(1, f"target: SGLang {fs.version}" + (f" (the trial ran SGLang {ran_on})" if ran_on and ran_on != fs.version else ""))
    header[2] = header[2].replace(f"model {spec.model}", f"model {model_label(spec.model)}")
    if (spec.backend_options or {}).get("load_format") == LoadFormat.DUMMY:
        header.append(f"measured with random weights from the model's config.json; --model-path is the "
                      f"checkpoint ({model_path}), set it to your copy")
    cli_flags: list[str] = []
    body_probe = render_config_yaml(flags, model_path=model_path, flagset=fs, cli_overflow=cli_flags)
    del body_probe
    config_name = Path(output).name if output else "best.yaml"
    launch = ["sglang", "serve", "--config", config_name, *cli_flags]
    if cli_flags:
        header.append(f"SGLang {fs.version}'s --config parser refuses {' '.join(a for a in cli_flags if a.startswith('--'))}: "
                      f"it is on the launch command below")
    if knobs.get("moe-tile-configs") == "tuned":
        gpu = get_gpu(spec.hardware.gpu)
        source = tuned_source_dir(spec.backend_options, gpu.name)
        gemm_files = tuned_gemm_files(source) if source.is_dir() else []
        for f in gemm_files:
            read_configs(f)  # a corrupt file is refused before anything is copied
        if output and source.is_dir():
            # merged over SGLang's shipped file where this machine has SGLang: at batch sizes the tune
            # did not time, SGLang's own entry stands instead of the nearest tuned one
            moe_root, written, filled = build_trial_moe_dir(
                Path(output).parent / (Path(output).stem + "-moe"), source, include_shipped=False, merge_shipped=True)
            moe_dir = moe_root.resolve()
            notes.append(f"copied {len(written)} tuned MoE tile file(s) to {moe_root}")
            for rel, keys in filled.items():
                notes.append(f"{rel}: SGLang's own entries (its shipped file's, else its default config) at batch "
                             f"sizes {', '.join(map(str, keys))} (not tuned)")
            if installed_sglang_config_root() is None:
                notes.append("SGLang is not installed here: the tuned files are copied as they are (SGLang "
                             "serves a batch size they lack with their nearest tuned entry)")
        else:
            moe_dir = source.resolve()
            if not source.is_dir():
                notes.append(f"warning: the tuned MoE tile directory {source} is not here; tune it with "
                             f"`tuner kernels tune` and set SGLANG_MOE_CONFIG_DIR to its parent of configs/")
        header.append(f"MoE tile configs: tuned; set SGLANG_MOE_CONFIG_DIR={moe_dir} before launching")
        launch = ["env", f"SGLANG_MOE_CONFIG_DIR={moe_dir}"] + launch
        header.extend(_ship_gemm_tiles(gemm_files, source, output, fs.version, notes))
    else:
        header.append("MoE tile configs: SGLang's shipped/default tiles (no SGLANG_MOE_CONFIG_DIR)")
    header.append("launch: " + shlex.join(launch))
    full = config_to_argv(config_yaml_dict(flags, model_path=model_path, flagset=fs, cli_overflow=[]), flagset=fs)
    header.append("equivalent: " + shlex.join(["sglang", "serve", *full, *cli_flags]))
    topo = plan_topology(flags, knobs)
    if topo.router_policy:
        header.append(f"router: python -m sglang_router.launch_router --worker-urls <server URL(s)> "
                      f"--policy {topo.router_policy}{' --dp-aware' if topo.dp_aware else ''}")
    text = render_config_yaml(flags, model_path=model_path, flagset=fs, header="\n".join(header), cli_overflow=[])
    _write(output, text)
    return text, notes


def _write(output: str | None, text: str) -> None:
    if output is not None:
        safewrite.write_text(output, text)
