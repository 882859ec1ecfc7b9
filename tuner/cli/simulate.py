"""`tuner simulate`: one simulated load point of a configuration on a study's workload."""

from __future__ import annotations

from pathlib import Path

import click

from tuner.cli._common import emit_json, json_option
from tuner.limits import MAX_SEED, MAX_USERS, MAX_WINDOW_S

KNOB_NAMES = ("router-policy", "moe-tile-configs")


def parse_config(text: str | None) -> tuple[dict, dict]:
    """Flags (+ knobs) from inline JSON/YAML or a YAML/JSON file; knobs are split off by name."""
    import yaml

    from tuner.errors import ConfigError

    if not text:
        return {}, {}
    source = "--config"
    path = Path(text)
    if len(text) < 4096 and path.suffix in (".yaml", ".yml", ".json") and path.exists():
        source, text = str(path), path.read_text()
    try:
        data = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid JSON or YAML: {exc}", file=source) from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError("must be a mapping of flag names to values", file=source)
    bad = [k for k in data if "_" in str(k)]
    if bad:
        raise ConfigError(f"flag names use dashes, not underscores: {bad}", file=source)
    knobs = {k: data.pop(k) for k in KNOB_NAMES if k in data}
    return data, knobs


@click.command(name="simulate")
@click.option("--study", "study_name", required=True, help="Study name (studies/NAME.yaml) or path.")
@click.option("--users", type=click.IntRange(1, MAX_USERS), required=True, help="Closed-loop users.")
@click.option("--config", "config", default=None,
              help="Flags as JSON/YAML text or a file (default: the study's baseline); "
                   "router-policy and moe-tile-configs are read as knobs.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None, help="Workload seed (default: the study's).")
@click.option("--duration-s", type=click.FloatRange(0, MAX_WINDOW_S, min_open=True), default=None,
              help="Override the measurement window.")
@click.option("--sglang-version", default=None,
              help="SGLang release whose scheduler and memory defaults are simulated (default: the study's "
                   "backend_options.sglang_version, else 0.5.23).")
@click.option("--fresh-server", is_flag=True,
              help="The load point is a newly started server's first traffic: it warms up the study's "
                   "measurement.first_warmup_s (when set) and goes through the fresh-server stalls measured for "
                   "this context (docs/calibration.md).")
@json_option
def simulate(study_name, users, config, seed, duration_s, sglang_version, fresh_server, as_json):
    """Predict P50/P90/P99 TTFT and TPOT of one configuration at USERS users."""
    from tuner.sim import simulate_load_point
    from tuner.config.load import load_study

    study = load_study(study_name)
    flags, knobs = parse_config(config) if config else (dict(study.baseline), {})
    if config is None:
        knobs = {k: flags.pop(k) for k in KNOB_NAMES if k in flags}
    # what every server of the study runs with (backend_options.server_flags, extra_server_args),
    # as its trials record it: the fitted calibration of that context applies
    from tuner.sim.measured import extra_args_to_flags
    from tuner.study.space import pinned_flags

    options = study.backend_options or {}
    flags = {**extra_args_to_flags(options.get("extra_server_args") or []), **pinned_flags(study), **flags}
    hw = study.hardware
    m = simulate_load_point(
        study.model, hw.gpu, hw.gpus_per_node, flags, knobs, study.workload_profile(), users,
        warmup_s=study.measurement.warmup_for(0 if fresh_server else 1),
        duration_s=duration_s or study.measurement.duration_s,
        seed=study.seed if seed is None else seed, nodes=hw.nodes, host_memory_gb=hw.host_memory_gb,
        sglang_version=sglang_version or (study.backend_options or {}).get("sglang_version"), fresh_server=fresh_server,
    )
    meets = m.meets(study.slo.p90_ttft_s, study.slo.p90_tpot_s)
    doc = {
        "users": users,
        "p50_ttft_s": m.p50_ttft_s, "p90_ttft_s": m.p90_ttft_s, "p99_ttft_s": m.p99_ttft_s,
        "p50_tpot_s": m.p50_tpot_s, "p90_tpot_s": m.p90_tpot_s, "p99_tpot_s": m.p99_tpot_s,
        "p90_itl_s": m.p90_itl_s,
        "throughput_tokens_per_s": m.throughput_tokens_per_s,
        "prefix_cache_hit_rate": m.prefix_cache_hit_rate,
        "kv_capacity_tokens_total": m.kv_capacity_tokens_total,
        "meets_slo": meets,
        "requests": m.requests,
        "errors": m.errors,
        "valid": m.valid,
        "sglang_version": m.extra.get("sglang_version"),
        "step_time_source": (m.extra.get("step_time_source") or {}).get("overall"),
        "flags": flags,
        "knobs": knobs,
        "extra": m.extra,
    }
    if as_json:
        emit_json(doc)
        return
    fmt = lambda v, scale=1.0, unit="s": "-" if v is None else f"{v * scale:.3f} {unit}"
    click.echo(f"{study.name}: {users} users, {m.requests} requests ({m.errors} errors)")
    click.echo(f"  TTFT p50/p90/p99: {fmt(m.p50_ttft_s)} / {fmt(m.p90_ttft_s)} / {fmt(m.p99_ttft_s)}")
    click.echo(f"  TPOT p50/p90/p99: {fmt(m.p50_tpot_s, 1000, 'ms')} / {fmt(m.p90_tpot_s, 1000, 'ms')} / "
               f"{fmt(m.p99_tpot_s, 1000, 'ms')}")
    click.echo(f"  throughput {m.throughput_tokens_per_s:.0f} tok/s, prefix hit rate "
               f"{(m.prefix_cache_hit_rate or 0):.1%}, KV tokens {m.kv_capacity_tokens_total:,}")
    click.echo(f"  SLO (P90 TTFT <= {study.slo.p90_ttft_s} s, P90 TPOT <= {study.slo.p90_tpot_s * 1000:.0f} ms): "
               f"{'met' if meets else 'missed'}")
