#!/usr/bin/env bash
# One device call: SGLang's one-batch benchmark of Qwen3-30B-A3B (fp8 weights and KV, as the H100
# study's trial 1) at the contexts the studies' servers decode at (4k-32k tokens a request, batch 1-16):
# whole decode steps where SGLang's Triton decode kernel is latency-bound, beside the short-context
# rows of results/profiles/h200/whole-steps-*.jsonl. Run from the repository root with carry
# [".sglkit/archives", ".sglkit/install.sh", ".whl"]:
#
#   OUT=$OUT LIMIT=420 bash results/h100-sglang/decode_probe.sh      # timeout_s 450
#   OUT=$OUT LIMIT=330 RUNS="ctx8k:1 2 8 32:8192;ctx24k:1 2 8:24576" bash results/h100-sglang/decode_probe.sh
#   OUT=$OUT LIMIT=420 CUDA_GRAPH_MAX_BS=64 RUNS="..." bash results/h100-sglang/decode_probe.sh  # the H200
#
# CUDA_GRAPH_MAX_BS (default 16) is the largest decode batch that runs as a CUDA graph, as on the
# studies' servers; a larger batch runs eager. KV_DTYPE (default fp8_e4m3; `auto` for the model's
# bf16) is the KV cache; KV_SPLITS, when set, SGLang's --triton-attention-num-kv-splits (default 8).
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-420}
t0=$(date +%s)
source results/h200-sglang/kit-setup.sh
probe_call_setup /tmp/call-logs-decode || exit $?
python3 -c 'import sys; sys.path.insert(0, "results/h100-sglang"); from gate_probe import write_model; write_model("/tmp/model-gate-probe")'
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
# RUNS: "name:batches:input-lens" separated by ";", each one server-less engine (its start ~40 s)
RUNS=${RUNS:-"ctx4k16k:1 4 16:4096 16384;ctx32k:1 4:32768"}
export CUDA_GRAPH_MAX_BS=${CUDA_GRAPH_MAX_BS:-16}
IFS=';' read -ra runs <<< "$RUNS"
for run in "${runs[@]}"; do
  name=${run%%:*}; rest=${run#*:}; batches=${rest%%:*}; lens=${rest#*:}
  l=$(left)
  [ "$l" -gt 90 ] || { echo "$name: skipped, only $l s left" | tee -a "$LOGS/steps.log"; continue; }
  timeout -s INT $(( l - 10 )) python3 - /tmp/model-gate-probe "$OUT/one-batch-$name.jsonl" "$batches" "$lens" \
    > "$LOGS/one-batch-$name.log" 2>&1 <<'PY'
import os, sys
import sglang.benchmark.one_batch as one_batch
one_batch.get_tokenizer = lambda *a, **k: None
model_dir, rows, batches, lens = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
sys.argv = ["one_batch", "--model-path", model_dir, "--load-format", "dummy", "--skip-tokenizer-init",
            "--attention-backend", "triton", "--sampling-backend", "pytorch", "--mem-fraction-static", "0.7",
            "--quantization", "fp8", "--kv-cache-dtype", os.environ.get("KV_DTYPE", "fp8_e4m3"), "--disable-prefill-cuda-graph",
            "--cuda-graph-max-bs", os.environ["CUDA_GRAPH_MAX_BS"], "--batch-size", *batches, "--input-len", *lens,
            "--output-len", "16", "--result-filename", rows,
            *(["--triton-attention-num-kv-splits", os.environ["KV_SPLITS"]] if os.environ.get("KV_SPLITS") else [])]
one_batch.cli_main()
PY
  echo "$name: rc $? at $(( $(date +%s) - t0 )) s, $(wc -l < "$OUT/one-batch-$name.jsonl" 2>/dev/null || echo 0) rows" \
    | tee -a "$LOGS/steps.log"
done
