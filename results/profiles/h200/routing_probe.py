"""How many distinct experts SGLang's router picks per MoE layer, in prefill and in decode, for a model
served with random weights (--load-format dummy). Runs SGLang's one-batch benchmark without CUDA
graphs (so the router's Python runs every step) and wraps TopK.forward_cuda to count, per call, the
tokens, the distinct hidden-state rows, the distinct experts picked and the distinct decode input ids.

Usage (on the GPU machine): python routing_probe.py MODEL_DIR OUT.json [one_batch flags...]
"""

from __future__ import annotations

import json
import sys

import torch

import sglang.benchmark.one_batch as one_batch
from sglang.srt.layers.moe import topk as topk_mod

model_dir, out_path, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
calls: list[dict] = []
decode_inputs: list[dict] = []
_orig_topk = topk_mod.TopK.forward_cuda
_orig_decode = one_batch.decode


def counting_topk(self, hidden_states, router_logits, **kw):
    out = _orig_topk(self, hidden_states, router_logits, **kw)
    ids = getattr(out, "topk_ids", None)
    if ids is not None:
        n = int(hidden_states.shape[0])
        lid = getattr(self, "layer_id", None)
        calls.append({"layer": -1 if lid is None else int(lid), "tokens": n,
                      "distinct_rows": int(torch.unique(hidden_states.float(), dim=0).shape[0]),
                      "distinct_experts": int(torch.unique(ids).numel()),
                      "topk": int(ids.shape[1])})
    return out


def counting_decode(input_token_ids, batch, model_runner):
    t = torch.as_tensor(input_token_ids)
    decode_inputs.append({"batch": int(t.numel()), "distinct_ids": int(torch.unique(t).numel())})
    return _orig_decode(input_token_ids, batch, model_runner)


topk_mod.TopK.forward_cuda = counting_topk
one_batch.decode = counting_decode
one_batch.get_tokenizer = lambda *a, **k: None
sys.argv = ["one_batch", "--model-path", model_dir, "--load-format", "dummy", "--skip-tokenizer-init",
            "--attention-backend", "triton", "--sampling-backend", "pytorch", "--mem-fraction-static", "0.6",
            "--disable-cuda-graph", *extra]
try:
    one_batch.cli_main()
finally:
    with open(out_path, "w") as f:
        json.dump({"moe_calls": calls, "decode_inputs": decode_inputs}, f)
    by = {}
    for c in calls:
        by.setdefault(c["tokens"], []).append(c["distinct_experts"])
    for n, v in sorted(by.items()):
        print(f"tokens {n}: distinct experts per MoE call min {min(v)} median {sorted(v)[len(v) // 2]} "
              f"max {max(v)} over {len(v)} calls")
    for d in decode_inputs[:6]:
        print(f"decode step: {d['distinct_ids']} distinct input ids of {d['batch']}")
