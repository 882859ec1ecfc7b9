"""`tuner model make-tiny`: random-weight local models of real architectures (no download)."""

from __future__ import annotations

import click

from tuner.cli._common import emit_json, json_option


@click.group()
def model():
    """Make small local models for end-to-end runs (no download)."""


@model.command("make-tiny")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--arch", type=click.Choice(["qwen3_moe", "deepseek_v3", "llama"]), default="qwen3_moe",
              show_default=True, help="Architecture (qwen3_moe: MoE; deepseek_v3: MoE + MLA).")
@click.option("--layers", type=int, default=2, show_default=True)
@click.option("--hidden", type=int, default=64, show_default=True, help="Hidden size.")
@click.option("--heads", type=int, default=4, show_default=True, help="Attention heads.")
@click.option("--kv-heads", type=int, default=2, show_default=True, help="KV heads (GQA; MLA uses --heads).")
@click.option("--head-dim", type=int, default=None, help="Head dim (default hidden/heads).")
@click.option("--intermediate", type=int, default=128, show_default=True, help="Dense MLP width.")
@click.option("--experts", type=int, default=8, show_default=True, help="Routed experts (MoE).")
@click.option("--experts-per-token", type=int, default=2, show_default=True)
@click.option("--moe-intermediate", type=int, default=32, show_default=True, help="Width of one expert.")
@click.option("--shared-experts", type=int, default=1, show_default=True, help="deepseek_v3 shared experts.")
@click.option("--dense-layers", type=int, default=0, show_default=True, help="deepseek_v3 leading dense layers.")
@click.option("--kv-lora-rank", type=int, default=32, show_default=True, help="deepseek_v3 MLA latent width.")
@click.option("--words", type=int, default=1000, show_default=True, help="Vocabulary size (w0..wN-1).")
@click.option("--max-position", type=int, default=8192, show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="Where to initialise weights (cpu, cuda).")
@json_option
def make_tiny(directory, device, as_json, **kw):
    """Write a random-weight model, a word-level tokenizer and a generation config to DIR.

    Every prompt word `w<i>` is one token, and generation always runs to max_tokens (the
    end-of-sequence id has no logit). Nothing is fetched from a hub.
    """
    from tuner.tinymodels.tiny import TinyModelShape, make_tiny_model

    spec = TinyModelShape(
        arch=kw["arch"], layers=kw["layers"], hidden=kw["hidden"], heads=kw["heads"],
        kv_heads=kw["kv_heads"], head_dim=kw["head_dim"], intermediate=kw["intermediate"],
        experts=kw["experts"], experts_per_token=kw["experts_per_token"],
        moe_intermediate=kw["moe_intermediate"], shared_experts=kw["shared_experts"],
        dense_layers=kw["dense_layers"], kv_lora_rank=kw["kv_lora_rank"], words=kw["words"],
        max_position=kw["max_position"], dtype=kw["dtype"], seed=kw["seed"],
    )
    summary = make_tiny_model(directory, spec, device=device)
    if as_json:
        emit_json(summary)
        return
    click.echo(f"{summary['arch']} model with {summary['parameters']:,} parameters "
               f"({summary['weight_bytes'] / 2**30:.2f} GiB, {spec.dtype}) written to {summary['dir']} "
               f"in {summary['seconds']:.1f} s")
