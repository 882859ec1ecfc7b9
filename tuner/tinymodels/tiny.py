"""Random-weight local models of real architectures, for end-to-end runs without downloads.

``make_tiny_model(out_dir, TinyModelShape(arch="qwen3_moe", layers=2, ...))`` writes a directory
that ``transformers serve`` (or any ``from_pretrained``) loads: config, seeded random weights
(safetensors), the word-level tokenizer of ``tuner.tinymodels.tokenizer`` and a generation config.

Why the outputs are always ``max_tokens`` long: the end-of-sequence id is ``words``, one past the
model's ``vocab_size``, so no logit exists for it and generation can only stop at the length limit.
Decoding is greedy, so a run is deterministic given the weights' seed.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from tuner.errors import ConfigError
from tuner.tinymodels.tokenizer import save_tokenizer

ARCHS = ("qwen3_moe", "deepseek_v3", "llama")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class TinyModelShape:
    """Shape of the model. Fields that an architecture does not use are ignored for it."""

    arch: str = "qwen3_moe"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None  # default hidden // heads
    intermediate: int = 128  # dense MLP width (llama; deepseek_v3's first dense layers)
    experts: int = 8  # routed experts (MoE archs)
    experts_per_token: int = 2
    moe_intermediate: int = 32  # width of one expert
    shared_experts: int = 1  # deepseek_v3
    dense_layers: int = 0  # deepseek_v3: first_k_dense_replace
    kv_lora_rank: int = 32  # deepseek_v3 (MLA latent width)
    q_lora_rank: int | None = None  # deepseek_v3 (None: no query compression)
    qk_rope_head_dim: int = 8  # deepseek_v3
    qk_nope_head_dim: int = 16  # deepseek_v3
    v_head_dim: int = 16  # deepseek_v3
    words: int = 1000  # vocabulary: w0..w{words-1}
    max_position: int = 8192
    dtype: str = "float32"
    seed: int = 0

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"unknown arch {self.arch!r}; valid: {', '.join(ARCHS)}", key="arch")
        if self.dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}", key="dtype")
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "words", "max_position"):
            if getattr(self, name) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, name)}", key=name)
        if self.words < 2:
            raise ConfigError(f"must be >= 2, got {self.words}", key="words")
        if self.arch != "deepseek_v3" and self.heads % self.kv_heads:
            raise ConfigError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})",
                              key="kv_heads")
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) "
                              "unless head_dim is given", key="hidden")
        if self.arch != "llama":
            if self.experts < 1 or not 1 <= self.experts_per_token <= self.experts:
                raise ConfigError(f"need 1 <= experts_per_token ({self.experts_per_token}) <= experts "
                                  f"({self.experts})", key="experts_per_token")
        if self.arch == "deepseek_v3" and self.dense_layers > self.layers:
            raise ConfigError(f"dense_layers ({self.dense_layers}) > layers ({self.layers})",
                              key="dense_layers")


def build_config(spec: TinyModelShape):
    """The transformers config object of ``spec`` (no weights)."""
    spec.validate()
    common = dict(
        vocab_size=spec.words,
        hidden_size=spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_position,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,  # set in the generation config only (outside the logits)
        pad_token_id=None,
    )
    head_dim = spec.head_dim or spec.hidden // spec.heads
    if spec.arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(intermediate_size=spec.intermediate, head_dim=head_dim, **common)
    if spec.arch == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            intermediate_size=spec.intermediate,
            head_dim=head_dim,
            moe_intermediate_size=spec.moe_intermediate,
            num_experts=spec.experts,
            num_experts_per_tok=spec.experts_per_token,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            **common,
        )
    from transformers import DeepseekV3Config

    # MLA: keys/values are compressed to a kv_lora_rank latent plus a shared rope key.
    n_group = 1
    # HF's MLA expands the latent to one key/value per query head: kv heads == heads.
    common["num_key_value_heads"] = spec.heads
    return DeepseekV3Config(
        intermediate_size=spec.intermediate,
        moe_intermediate_size=spec.moe_intermediate,
        n_routed_experts=spec.experts,
        n_shared_experts=spec.shared_experts,
        num_experts_per_tok=spec.experts_per_token,
        n_group=n_group,
        topk_group=n_group,
        first_k_dense_replace=spec.dense_layers,
        kv_lora_rank=spec.kv_lora_rank,
        q_lora_rank=spec.q_lora_rank,
        qk_rope_head_dim=spec.qk_rope_head_dim,
        qk_nope_head_dim=spec.qk_nope_head_dim,
        v_head_dim=spec.v_head_dim,
        **common,
    )


def make_tiny_model(out_dir: str | Path, spec: TinyModelShape, *, device: str = "cpu") -> dict:
    """Build, randomly initialise (seeded) and save the model; return a summary dict.

    ``device`` is where the weights are initialised ("cuda" makes multi-billion-parameter models in
    seconds); they are saved the same either way.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec.validate()
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; choose a new directory", key="DIR")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    config = build_config(spec)
    dtype = getattr(torch, spec.dtype)
    torch.manual_seed(spec.seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    model.generation_config = GenerationConfig(
        do_sample=False,
        eos_token_id=spec.words,
        pad_token_id=0,
        bos_token_id=None,
    )
    model.save_pretrained(str(out), max_shard_size="4GB")
    tok = save_tokenizer(out, spec.words, model_max_length=spec.max_position)
    summary = {
        "dir": str(out),
        "arch": spec.arch,
        "model_type": config.model_type,
        "architectures": list(getattr(config, "architectures", None) or [type(model).__name__]),
        "parameters": params,
        "weight_bytes": params * torch.finfo(dtype).bits // 8,
        "spec": asdict(spec),
        "tokenizer": tok,
        "seconds": round(time.monotonic() - t0, 2),
    }
    (out / "tuner_model.json").write_text(json.dumps(summary, indent=2) + "\n")
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return summary


def spec_field_names() -> list[str]:
    return [f.name for f in fields(TinyModelShape)]
