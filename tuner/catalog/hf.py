"""Models as Hugging Face ``config.json``: read one into the catalog's ``ModelDescription``, render one back.

A study's ``model`` is one of

* a catalog name (``qwen3-30b-a3b``);
* a local directory holding a ``config.json`` (``./models/my-moe``);
* a mapping ``{name: <catalog name or directory>, overrides: {num_hidden_layers: 5}}``: the model's
  config with some keys changed (a few-layer DeepSeek-V3 for a one-GPU run, say).

All three become the one ``ModelDescription`` that the planner, the simulator and the kernel tuner use.
``render_hf_config`` goes the other way: the ``config.json`` that SGLang loads with
``--load-format dummy`` (random weights of the real shapes, nothing downloaded), with the
``quantization_config`` of the checkpoint a trial runs.
"""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.catalog.descriptions import Checkpoint, ModelDescription
from tuner.errors import ConfigError
from tuner.paths import user_path

#: HF architecture -> (attention kind, family); anything else is refused
ARCHITECTURES: dict[str, tuple[Literal["gqa", "mla", "dsa"], str]] = {
    "Qwen3MoeForCausalLM": ("gqa", "qwen3_moe"),
    "Qwen3ForCausalLM": ("gqa", "qwen3"),
    "LlamaForCausalLM": ("gqa", "llama"),
    "DeepseekV3ForCausalLM": ("mla", "deepseek_v3"),
    "DeepseekV2ForCausalLM": ("mla", "deepseek_v2"),
    "GlmMoeDsaForCausalLM": ("dsa", "glm_moe_dsa"),
}

# Keys SGLang needs beyond the shapes, per family, as the public checkpoints set them.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"model_type": "qwen3_moe", "hidden_act": "silu", "rms_norm_eps": 1e-6,
                  "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
                  "attention_dropout": 0.0, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "norm_topk_prob": True, "output_router_logits": False, "router_aux_loss_coef": 0.001,
                  "use_sliding_window": False, "sliding_window": None, "bos_token_id": 151643,
                  "eos_token_id": 151645, "initializer_range": 0.02, "use_cache": True},
    "qwen3": {"model_type": "qwen3", "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
              "use_sliding_window": False, "sliding_window": None, "bos_token_id": 151643,
              "eos_token_id": 151645, "initializer_range": 0.02, "use_cache": True},
    "llama": {"model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "bos_token_id": 128000,
              "eos_token_id": 128009, "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True},
    "deepseek_v3": {"model_type": "deepseek_v3", "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000,
                    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                     "type": "yarn"},
                    "attention_bias": False, "attention_dropout": 0.0, "moe_layer_freq": 1, "n_group": 8,
                    "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "aux_loss_alpha": 0.001,
                    "seq_aux": True, "ep_size": 1, "bos_token_id": 0, "eos_token_id": 1,
                    "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True},
    "deepseek_v2": {"model_type": "deepseek_v2", "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000,
                    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                                     "type": "yarn"},
                    "attention_bias": False, "attention_dropout": 0.0, "moe_layer_freq": 1, "n_group": 1,
                    "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
                    "routed_scaling_factor": 1.0, "norm_topk_prob": False, "aux_loss_alpha": 0.001,
                    "seq_aux": True, "ep_size": 1, "bos_token_id": 100000, "eos_token_id": 100001,
                    "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True},
    "glm_moe_dsa": {"model_type": "glm_moe_dsa", "hidden_act": "silu", "rms_norm_eps": 1e-5,
                    "rope_theta": 1000000, "rope_scaling": None, "attention_bias": False,
                    "attention_dropout": 0.0, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
                    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "routed_scaling_factor": 2.5,
                    "norm_topk_prob": True, "ep_size": 1, "bos_token_id": 0, "eos_token_id": [154820, 154827, 154829],
                    "initializer_range": 0.02, "use_cache": True},
}

# quantization_config of each weight format's public checkpoints (bf16: none)
_QUANT_CONFIGS: dict[str, dict[str, Any] | None] = {
    "bf16": None,
    "fp8_block": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [128, 128]},
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
              "exclude_modules": ["lm_head"]},
}

MAX_OVERRIDES = 64


class ModelRef(BaseModel):
    """A model given as ``{name: ..., overrides: {...}}`` in a study.

    The loader fills ``hf_config`` with the config the reference resolves to (overrides applied),
    so the reference travels to Ray workers without the files it came from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=4096,
                      description="catalog model name, or a directory holding config.json")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="config.json keys to change, e.g. num_hidden_layers: 5")
    hf_config: dict[str, Any] | None = Field(default=None, description="resolved config (filled in by tuner)")

    @model_validator(mode="after")
    def _bounded(self):
        if len(self.overrides) > MAX_OVERRIDES:
            raise ValueError(f"at most {MAX_OVERRIDES} overrides, got {len(self.overrides)}")
        return self

    @property
    def label(self) -> str:
        if not self.overrides:
            return self.name
        return f"{self.name} (" + ", ".join(f"{k}={v}" for k, v in sorted(self.overrides.items())) + ")"


# ------------------------------------------------------------------------------------------------
# reading


def read_config_dir(path: str | Path, *, key: str = "model", file: str | None = None) -> dict[str, Any]:
    """The ``config.json`` of a model directory, as a dict (ConfigError naming what is wrong)."""
    d = user_path(path)
    if not d.is_dir():
        raise ConfigError(f"{str(path)!r} is neither a catalog model nor a directory", file=file, key=key)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"model directory {str(d)!r} has no config.json (a Hugging Face model config is "
                          f"needed; with load_format: dummy nothing else is)", file=file, key=key)
    if cfg_path.stat().st_size > 4 * 2**20:
        raise ConfigError(f"{cfg_path} is larger than 4 MiB: not a model config", file=file, key=key)
    try:
        data = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{cfg_path} is not valid JSON: {exc}", file=file, key=key) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{cfg_path} must hold a JSON object", file=file, key=key)
    return data


def architecture_of(cfg: Mapping[str, Any], *, key: str = "model", file: str | None = None) -> str:
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError("config.json has no 'architectures' list; tuner needs it to know the model's "
                          f"shape; supported: {', '.join(ARCHITECTURES)}", file=file, key=key)
    arch = archs[0]
    if arch not in ARCHITECTURES:
        close = difflib.get_close_matches(arch, list(ARCHITECTURES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unsupported architecture {arch!r}{hint}; tuner models "
                          f"{', '.join(ARCHITECTURES)}", file=file, key=key)
    return arch


def _int(cfg: Mapping[str, Any], name: str, default: Any = ..., *, file: str | None, key: str) -> Any:
    value = cfg.get(name, default)
    if value is ...:
        raise ConfigError(f"config.json lacks {name!r}", file=file, key=key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
        raise ConfigError(f"config.json {name!r} must be a non-negative integer, got {value!r}", file=file, key=key)
    return int(value)


def checkpoint_format(cfg: Mapping[str, Any]) -> str:
    """bf16, fp8_block or nvfp4 from a config's ``quantization_config``."""
    q = cfg.get("quantization_config")
    if not q:
        return "bf16"
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "fp8_block"
    if method in ("modelopt", "modelopt_fp4") and "fp4" in str(q.get("quant_algo", "")).lower():
        return "nvfp4"
    raise ConfigError(f"config.json quantization_config {method!r} is not one tuner models "
                      "(fp8 block, ModelOpt NVFP4 or none)", key="model")


def model_from_hf_config(cfg: Mapping[str, Any], *, name: str, display_name: str | None = None,
                         checkpoints: Mapping[str, Any] | None = None, hf_id: str | None = None,
                         file: str | None = None, key: str = "model"):
    """The catalog's ``ModelDescription`` for a Hugging Face config dict."""

    arch = architecture_of(cfg, key=key, file=file)
    attention, family = ARCHITECTURES[arch]

    def i(n, d=...):
        return _int(cfg, n, d, file=file, key=key)

    hidden = i("hidden_size")
    layers = i("num_hidden_layers")
    heads = i("num_attention_heads")
    if not hidden or not layers or not heads:
        raise ConfigError("config.json hidden_size, num_hidden_layers and num_attention_heads must be > 0",
                          file=file, key=key)
    kv_heads = i("num_key_value_heads", heads)
    fields: dict[str, Any] = dict(
        hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=i("intermediate_size"), vocab_size=i("vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_context_tokens=i("max_position_embeddings", 4096),
    )
    if family in ("qwen3_moe",):
        mlp_only = cfg.get("mlp_only_layers") or []
        step = i("decoder_sparse_step", 1) or 1
        dense = sum(1 for layer in range(layers) if layer in mlp_only or (layer + 1) % step != 0)
        fields.update(first_k_dense=dense, moe_intermediate_size=i("moe_intermediate_size"),
                      n_routed_experts=i("num_experts"), n_shared_experts=0,
                      experts_per_token=i("num_experts_per_tok"),
                      head_dim=i("head_dim", hidden // heads), mtp_layers=0)
    elif family in ("qwen3", "llama"):
        fields.update(first_k_dense=layers, moe_intermediate_size=0, n_routed_experts=0, n_shared_experts=0,
                      experts_per_token=0, head_dim=i("head_dim", hidden // heads), mtp_layers=0)
    else:  # MLA families
        fields.update(first_k_dense=min(layers, i("first_k_dense_replace", 0)),
                      moe_intermediate_size=i("moe_intermediate_size"),
                      n_routed_experts=i("n_routed_experts"), n_shared_experts=i("n_shared_experts", 0) or 0,
                      experts_per_token=i("num_experts_per_tok"),
                      q_lora_rank=i("q_lora_rank", None), kv_lora_rank=i("kv_lora_rank"),
                      qk_nope_head_dim=i("qk_nope_head_dim"), qk_rope_head_dim=i("qk_rope_head_dim"),
                      v_head_dim=i("v_head_dim"), mtp_layers=i("num_nextn_predict_layers", 0) or 0)
        if attention == "dsa":
            fields.update(index_n_heads=i("index_n_heads"), index_head_dim=i("index_head_dim"),
                          index_topk=i("index_topk"))
    if checkpoints is None:
        fmt = checkpoint_format(cfg)
        quant = {"bf16": None, "fp8_block": "fp8", "nvfp4": "modelopt_fp4"}[fmt]
        unquant = {"bf16": [], "fp8_block": ["embedding", "lm_head", "router", "norms"],
                   "nvfp4": ["attention", "dense_mlp", "shared_expert", "embedding", "lm_head", "router",
                             "indexer", "mtp", "norms"]}[fmt]
        label = {"bf16": "bf16", "fp8_block": "fp8", "nvfp4": "nvfp4"}[fmt]
        checkpoints = {label: Checkpoint(hf_id=hf_id or name, sglang_quantization=quant, weight_format=fmt,
                                         unquantized=tuple(unquant))}
    base = dict(cfg)
    return ModelDescription(name=name, display_name=display_name or name, hf_id=hf_id or name, architecture=arch,
                     attention=attention, checkpoints=dict(checkpoints),
                     hf_config_json=json.dumps(base, sort_keys=True), **fields)


# ------------------------------------------------------------------------------------------------
# rendering


def hf_config_of(model) -> dict[str, Any]:
    """The model's config.json: the one it was read from, or, for a catalog model, rendered from its
    shapes and its family's usual keys (no ``quantization_config``: that is per checkpoint)."""
    if getattr(model, "hf_config_json", None):
        return json.loads(model.hf_config_json)
    attention, family = ARCHITECTURES.get(model.architecture, (None, None))
    if family is None:
        raise ConfigError(f"cannot render a config.json for architecture {model.architecture!r}", key="model")
    cfg: dict[str, Any] = copy.deepcopy(_FAMILY_DEFAULTS[family])
    cfg.update(architectures=[model.architecture], hidden_size=model.hidden_size,
               num_hidden_layers=model.num_layers, num_attention_heads=model.num_attention_heads,
               num_key_value_heads=model.num_kv_heads, intermediate_size=model.intermediate_size,
               vocab_size=model.vocab_size, tie_word_embeddings=model.tie_word_embeddings,
               max_position_embeddings=model.max_context_tokens, torch_dtype="bfloat16")
    if family == "qwen3_moe":
        cfg.update(head_dim=model.head_dim, moe_intermediate_size=model.moe_intermediate_size,
                   num_experts=model.n_routed_experts, num_experts_per_tok=model.experts_per_token,
                   max_window_layers=model.num_layers,
                   mlp_only_layers=list(range(model.first_k_dense)))
    elif family in ("qwen3", "llama"):
        cfg.update(head_dim=model.head_dim)
        if family == "qwen3":
            cfg["max_window_layers"] = model.num_layers
    else:
        cfg.update(first_k_dense_replace=model.first_k_dense, moe_intermediate_size=model.moe_intermediate_size,
                   n_routed_experts=model.n_routed_experts, n_shared_experts=model.n_shared_experts,
                   num_experts_per_tok=model.experts_per_token, q_lora_rank=model.q_lora_rank,
                   kv_lora_rank=model.kv_lora_rank, qk_nope_head_dim=model.qk_nope_head_dim,
                   qk_rope_head_dim=model.qk_rope_head_dim, v_head_dim=model.v_head_dim,
                   num_nextn_predict_layers=model.mtp_layers)
        if family == "deepseek_v3" and model.n_routed_experts % 8:
            cfg.update(n_group=1, topk_group=1)  # expert groups must divide the experts
        if attention == "dsa":
            cfg.update(index_n_heads=model.index_n_heads, index_head_dim=model.index_head_dim,
                       index_topk=model.index_topk)
    return cfg


def render_hf_config(model, weight_format: str = "bf16") -> dict[str, Any]:
    """config.json for ``--load-format dummy``: the model's config plus the checkpoint's quantization."""
    if weight_format not in _QUANT_CONFIGS:
        raise ConfigError(f"unknown weight format {weight_format!r}; valid: {', '.join(_QUANT_CONFIGS)}",
                          key="quantization")
    cfg = hf_config_of(model)
    if cfg.get("quantization_config") and checkpoint_format(cfg) == weight_format:
        return cfg  # the model's own quantization settings
    cfg.pop("quantization_config", None)
    q = _QUANT_CONFIGS[weight_format]
    if q is not None:
        cfg["quantization_config"] = copy.deepcopy(q)
    return cfg


def write_model_dir(model, weight_format: str, directory: str | Path) -> Path:
    """A directory holding only the rendered ``config.json`` (all SGLang needs for dummy weights)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(render_hf_config(model, weight_format), indent=1, sort_keys=True) + "\n")
    return d


# ------------------------------------------------------------------------------------------------
# references


def apply_overrides(cfg: Mapping[str, Any], overrides: Mapping[str, Any], *, file: str | None = None,
                    key: str = "model.overrides") -> dict[str, Any]:
    """``cfg`` with ``overrides``; keys must be keys of the config (a typo is refused)."""
    out = dict(cfg)
    for name, value in overrides.items():
        if name == "architectures":
            raise ConfigError("the architecture cannot be overridden; use a model of that architecture",
                              file=file, key=f"{key}.{name}")
        if name not in out:
            close = difflib.get_close_matches(str(name), list(out), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"not a key of this model's config.json{hint}; keys: {', '.join(sorted(out))}",
                              file=file, key=f"{key}.{name}")
        old = out[name]
        if isinstance(old, bool) != isinstance(value, bool) or (
                isinstance(old, (int, float)) and not isinstance(old, bool)
                and (isinstance(value, bool) or not isinstance(value, (int, float)))):
            raise ConfigError(f"must be {type(old).__name__} like the config's {old!r}, got {value!r}",
                              file=file, key=f"{key}.{name}")
        out[name] = value
    return out
