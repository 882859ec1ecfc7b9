"""`tuner serve-sim`: an OpenAI-compatible streaming server timed by the simulator."""

from __future__ import annotations

import os
import signal
import sys

import click


@click.command(name="serve-sim")
@click.option("--model", default="glm-5.1", show_default=True, help="Catalog model name.")
@click.option("--hardware", default="h200", show_default=True, help="Catalog GPU name.")
@click.option("--gpus", type=int, default=8, show_default=True, help="GPUs per node.")
@click.option("--config", "config", default=None,
              help="Flags as JSON/YAML text or file (default: tp-size = GPUs, the model's smallest checkpoint).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=30000, show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Run simulated time this many times faster than real time.")
@click.option("--fault", default=None, help="exit_at_start | crash_after_s=N | hang | hang_after_s=N | oom | slow_start_s=N")
@click.option("--sglang-version", default="0.5.23", show_default=True,
              help="SGLang release whose scheduler rules and memory defaults are simulated (0.5.17 or 0.5.23).")
def serve_sim(model, hardware, gpus, config, host, port, time_scale, fault, sglang_version):
    """Serve /v1/completions, /generate, /health, /server_info and /v1/models with simulated timing.

    The same simulator core as `tuner simulate` (scheduler, router, step times) runs in real time."""
    # a stop signal during start-up (imports, planning: seconds) ends the process at once, whatever
    # disposition it inherited; once serving, aiohttp's own handlers shut down, within SHUTDOWN_S
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    from aiohttp import web

    from tuner.catalog import get_gpu, get_model
    from tuner.cli.simulate import parse_config
    from tuner.errors import ConfigError
    from tuner.planner import plan_memory
    from tuner.sim.online import build_online_engine
    from tuner.sim.scheduler import check_version
    from tuner.sim.server import SimServer, oom_message, parse_fault

    fault_name, fault_value = parse_fault(fault)
    if time_scale <= 0:
        raise ConfigError("must be > 0", key="time-scale")
    m, gpu = get_model(model), get_gpu(hardware)
    flags, knobs = parse_config(config)
    if not flags:
        fmt = "nvfp4" if "nvfp4" in m.checkpoints else next(iter(m.checkpoints))
        flags = {"tp-size": gpus, "quantization": m.checkpoints[fmt].sglang_quantization}
    version = check_version(sglang_version)
    plan = plan_memory(m, gpu, gpus, flags, sglang_version=version)
    click.echo(f"serve-sim: {m.display_name} on {plan.gpus_used}x {gpu.display_name}, flags {flags}", err=True)
    if fault_name == "exit_at_start":
        click.echo("RuntimeError: simulated failure at start (fault exit_at_start)", err=True)
        sys.exit(1)
    if fault_name == "oom" or not plan.fits:
        sys.stderr.write(oom_message(plan))
        sys.stderr.flush()
        sys.exit(1)
    engine, _ = build_online_engine(m, gpu, gpus, flags, knobs, sglang_version=version, time_scale=time_scale,
                                    plan=plan)
    server_args = {"model_path": m.hf_id, "served_model_name": m.name, "host": host, "port": port,
                   **{k.replace("-", "_"): v for k, v in flags.items()}}
    server = SimServer(engine, plan, model_name=m.name, server_args=server_args,
                       fault=(fault_name, fault_value), time_scale=time_scale)
    click.echo(f"KV tokens per pool {plan.kv_capacity_tokens_per_gpu:,} x {plan.kv_pools} pools; "
               f"listening on http://{host}:{port}", err=True)
    web.run_app(server.app(), host=host, port=port, print=None, shutdown_timeout=SHUTDOWN_S)


SHUTDOWN_S = 2.0  # what a stopping server gives its open requests (aiohttp's default: 60 s)


def _exit_on_signal(signum, frame):
    os._exit(128 + signum)
