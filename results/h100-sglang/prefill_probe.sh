#!/usr/bin/env bash
# One device call: prefill_probe.py (lone prompts by size, with and without prefill CUDA graphs) on
# whichever GPU the call gets, then SGLang's one-batch benchmark at the same sizes in both modes (the
# forward alone, without the server's scheduling), logs and results in $OUT. Run from the repository
# root with carry [".sglkit/archives", ".sglkit/install.sh", ".whl"]:
#
#   OUT=$OUT LIMIT=520 GPU=h100 bash results/h100-sglang/prefill_probe.sh      # timeout_s 550
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-520}
GPU=${GPU:-h100}
t0=$(date +%s)
source results/h200-sglang/kit-setup.sh
probe_call_setup /tmp/call-logs-prefill || exit $?
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
timeout -s INT $(( $(left) - 150 )) python3 results/h100-sglang/prefill_probe.py --out "$OUT" --gpu "$GPU" \
  --reps "${REPS:-6}" --modes "${MODES:-eager,graph}" --probe "${PROBE:-qwen3}" 2>&1 | tee "$LOGS/prefill-probe.log" | grep -v "^\[" | tail -20
python3 results/h100-sglang/prefill_probe.py --out "$OUT" --report 2>&1 | tee "$LOGS/report.log"
# the forward alone: bench_one_batch, batch 1, the probe's prompt sizes (eager first: no graph capture)
for mode in ${WHOLE_MODES-eager graph}; do  # WHOLE_MODES= skips the one-batch runs
  l=$(left)
  [ "$l" -gt 100 ] || { echo "one-batch $mode: skipped, only $l s left" | tee -a "$LOGS/steps.log"; continue; }
  extra=(); [ "$mode" = eager ] && extra=(--disable-prefill-cuda-graph)
  timeout -s INT $(( l - 15 )) python3 - /tmp/model-gate-probe "$OUT/one-batch-$mode.jsonl" "${extra[@]}" \
    > "$LOGS/one-batch-$mode.log" 2>&1 <<'PY'
import sys
import sglang.benchmark.one_batch as one_batch
one_batch.get_tokenizer = lambda *a, **k: None
model_dir, rows, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = ["one_batch", "--model-path", model_dir, "--load-format", "dummy", "--skip-tokenizer-init",
            "--attention-backend", "triton", "--sampling-backend", "pytorch", "--mem-fraction-static", "0.6",
            "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3", "--chunked-prefill-size", "8192",
            "--cuda-graph-max-bs", "8", "--batch-size", "1", "--input-len", "64", "256", "1024", "2048", "4096",
            "8192", "--output-len", "8", "--result-filename", rows, *extra]
one_batch.cli_main()
PY
  echo "one-batch $mode: rc $? at $(( $(date +%s) - t0 )) s, $(wc -l < "$OUT/one-batch-$mode.jsonl" 2>/dev/null || echo 0) rows" \
    | tee -a "$LOGS/steps.log"
done
