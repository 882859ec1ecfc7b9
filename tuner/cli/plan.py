"""`tuner plan`: memory planner for one configuration."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option


@click.command(name="plan")
@click.option("--model", required=True, help="Catalog model name (e.g. glm-5.1).")
@click.option("--quantization", default=None,
              help="SGLang --quantization value (fp8, modelopt_fp4); omit or 'none' for bf16.")
@click.option("--hardware", required=True, help="Catalog GPU name (h100, h200, b200, rtx-pro-6000).")
@click.option("--gpus", type=int, required=True, help="GPUs per node.")
@click.option("--nodes", type=int, default=1, show_default=True)
@click.option("--host-memory-gb", type=float, default=None, help="Host memory per node (checks HiCache).")
@click.option("--tp-size", type=int, required=True)
@click.option("--attn-dp-size", type=int, default=None)
@click.option("--ep-size", type=int, default=None)
@click.option("--dp-size", type=int, default=None)
@click.option("--kv-cache-dtype", default=None)
@click.option("--mem-fraction-static", type=float, default=None)
@click.option("--chunked-prefill-size", type=int, default=None)
@click.option("--max-running-requests", type=int, default=None)
@click.option("--max-total-tokens", default=None)
@click.option("--cuda-graph-max-bs-decode", type=int, default=None)
@click.option("--speculative-algorithm", default=None)
@click.option("--enable-hierarchical-cache", is_flag=True, default=False)
@click.option("--hicache-ratio", type=float, default=None)
@click.option("--hicache-size", type=float, default=None, help="Host pool per GPU in GB (overrides the ratio).")
@click.option("--attention-backend", default=None, help="SGLang --attention-backend (default: SGLang's for the GPU).")
@click.option("--sglang-version", default="0.5.23", show_default=True,
              help="SGLang release whose defaults are applied (0.5.17 or 0.5.23).")
@json_option
def plan(model, quantization, hardware, gpus, nodes, host_memory_gb, sglang_version, as_json, **flag_values):
    """Weights, KV capacity and fit of a configuration (start-up memory after the KV pool
    included), following SGLang's own accounting for the given version."""
    from tuner.planner import plan_memory

    flags = {name.replace("_", "-"): v for name, v in flag_values.items() if v not in (None, False)}
    if quantization and quantization.lower() not in ("none", "bf16"):
        flags["quantization"] = quantization
    result = plan_memory(model, hardware, gpus, flags, nodes=nodes, host_memory_gb=host_memory_gb,
                         sglang_version=sglang_version)
    if as_json:
        emit_json(result.to_dict())
        return
    _print_table(result)


def _print_table(p) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{p.model} on {p.gpus_used}x {p.gpu}  (tp {p.tp_size}, attn-dp {p.attn_dp_size}, "
                        f"ep {p.ep_size}, dp {p.dp_size}, {p.weight_format})")
    table.add_column("item")
    table.add_column("value", justify="right")
    for kind, gb in p.weights_gb_by_kind.items():
        if gb:
            table.add_row(f"weights: {kind}", f"{gb:.2f} GB")
    rows = [
        ("weights per GPU", f"{p.weights_gb_per_gpu:.2f} GB"),
        ("mem_fraction_static", f"{p.mem_fraction_static} (default {p.mem_fraction_static_default})"),
        ("reserved", f"{p.reserved_mib:.0f} MiB"),
        ("KV dtype / page", f"{p.kv_cache_dtype} / {p.page_size}"),
        ("KV bytes per token", f"{p.bytes_per_token:,}"),
        ("KV cache per GPU", f"{p.kv_cache_gb_per_gpu:.2f} GB"),
        ("KV tokens per pool", f"{p.kv_capacity_tokens_per_gpu:,}"),
        ("KV pools", str(p.kv_pools)),
        ("KV tokens total", f"{p.kv_capacity_tokens_total:,}"),
        ("max running requests", f"{p.max_running_requests} ({p.max_running_requests_per_dp_rank} per DP rank)"),
        ("chunked prefill per rank", str(p.chunked_prefill_size)),
        ("decode CUDA-graph max bs", str(p.cuda_graph_max_bs_decode)),
        ("attention backend", p.attention_backend),
        ("start-up after the KV pool", f"{p.startup_gb_per_gpu:.2f} GB of {p.startup_free_gb_per_gpu:.2f} GB left"),
        ("SGLang version (defaults)", p.sglang_version),
    ]
    if p.hierarchical_cache:
        rows.append(("HiCache host tokens per pool", f"{p.hicache_host_tokens_per_pool:,} "
                                                       f"({p.hicache_host_gb_total:.0f} GB host total)"))
    for row in rows:
        table.add_row(*row)
    table.add_row("fits", ("yes" if p.fits else "NO: " + p.reason))
    console = Console()
    console.print(table)
    for w in p.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
