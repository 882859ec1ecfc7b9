"""Which experts a MoE router really spreads tokens over when the server runs random weights.

A study served with ``--load-format dummy`` (``backend_options.load_format: dummy``) runs every
weight as a small random value, the router's included. Where the gate's scores are a softmax of
the router's logits (Qwen3-MoE, DeepSeek-V2's ``greedy``), random logits still pick experts apart
and a batch touches about as many experts as uniform routing would. Where the gate adds a
per-expert score-correction bias before its (grouped) top-k (``topk_method: noaux_tc``:
DeepSeek-V3, GLM-5.x), the sigmoid scores of near-zero logits are all about 0.5 and the random
bias decides: every token picks nearly the same experts. Measured on the H200 with SGLang 0.5.17
(``results/profiles/h200/routing-dsv3-8l.json``, SGLang's ``TopK.forward_cuda`` counted in its
one-batch benchmark of DeepSeek-V3 with 8 layers): 10-11 distinct experts per MoE call out of 257
(top-8 routed plus the fused shared expert), in prefill (16,384 tokens) and in decode (batch 64)
alike. So the routed pool is top-k plus about two near-ties, whatever the batch.

What it changes: a decode step reads about ``pool`` experts' weights per MoE layer instead of the
hundreds a batch of uniformly routed tokens touches; compute (tokens x top-k) is unchanged. Only the
dummy-weight case: a real checkpoint's router is trained to balance its experts. The GLM gate is the
same mechanism, not measured (UNVERIFIED).
"""

from __future__ import annotations

from typing import Any, Mapping

from .hf import hf_config_of
from tuner.errors import ConfigError
from tuner.vocabulary import LoadFormat

# the server flag the sglang backend launches random weights with (--load-format dummy)
LOAD_FORMAT_FLAG = "load-format"

# routed experts beyond top-k that a collapsed biased gate still reaches (measured: 9-10 routed of
# 256 for top-8, the fused shared expert aside; results/profiles/h200/routing-dsv3-8l.json)
COLLAPSED_GATE_EXTRA_EXPERTS = 2

# gates whose top-k ranks scores plus a per-expert correction bias (SGLang's biased_grouped_topk)
_BIASED_GATES = frozenset({"noaux_tc"})


def random_weight_flags(options: Mapping[str, Any] | None) -> dict[str, str]:
    """The server flag a study's backend options add for random weights (``{}`` for real ones):
    merged into the flags a simulation of that study's servers gets."""
    fmt = str((options or {}).get("load_format") or LoadFormat.AUTO)
    return {LOAD_FORMAT_FLAG: LoadFormat.DUMMY.value} if fmt == LoadFormat.DUMMY else {}


def has_biased_gate(model) -> bool:
    """Whether the model's router adds a score-correction bias before its top-k (from its config.json)."""
    try:
        cfg = hf_config_of(model)
    except ConfigError:  # an architecture without a config.json rendering: no known gate
        return False
    return str(cfg.get("topk_method") or "") in _BIASED_GATES


def routed_expert_pool(model, flags: Mapping[str, Any] | None) -> int | None:
    """How many routed experts a MoE layer's tokens actually spread over (None: all of them, routed
    apart as a trained router does): ``top-k + COLLAPSED_GATE_EXTRA_EXPERTS`` for a biased gate under
    random weights."""
    if not getattr(model, "is_moe", False):
        return None
    if str((flags or {}).get(LOAD_FORMAT_FLAG) or "") != LoadFormat.DUMMY or not has_biased_gate(model):
        return None
    return min(model.n_routed_experts, model.experts_per_token + COLLAPSED_GATE_EXTRA_EXPERTS)


__all__ = ["COLLAPSED_GATE_EXTRA_EXPERTS", "LOAD_FORMAT_FLAG", "has_biased_gate",
           "random_weight_flags", "routed_expert_pool"]
