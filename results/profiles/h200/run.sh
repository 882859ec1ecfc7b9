#!/usr/bin/env bash
# One device call on the H200 machine: time SGLang 0.5.17's own operators at the studies' shapes
# (`tuner profile run`, the tables the simulator interpolates), time whole forward steps of the
# same model with SGLang's one-batch benchmark, and compare the two (`tuner profile compose`).
# Run from the repository root with carry [".sglkit/archives", ".sglkit/install.sh", ".whl"]
# (no Ray needed):
#
#   OUT=$OUT LIMIT=540 STEPS="qwen3-bf16 qwen3-fp8" bash results/profiles/h200/run.sh
#
# Each step NAME writes results/profiles/h200/tables/<model>-tp1-<dtype>-triton-0.5.17.json (the
# profile), results/profiles/h200/whole-steps-NAME.jsonl (bench_one_batch's rows) and
# compose-NAME.json; everything comes back packed in $OUT/profiles.tgz (extract at the repository
# root). STEPS: qwen3-bf16, qwen3-fp8 (Qwen3-30B-A3B, bf16 and fp8 block weights, with whole
# steps; qwen3-bf16-ops and qwen3-fp8-ops: the operators only), qwen3-bf16-fp8kv, qwen3-fp8-fp8kv (the same with fp8 KV, operators only), dsv3-fp8
# (DeepSeek-V3's operators, fp8 weights and fp8 KV; no whole steps: the 61-layer model does not fit
# one GPU), dsv3-8l-whole (whole steps of DeepSeek-V3 with 8 of its layers, as the MLA study serves it,
# composed against the dsv3-fp8 profile: the operators are keyed by shape, so the profile covers the
# variant), dsv3-8l-routing (routing_probe.py: distinct experts per MoE call of that model in prefill
# and decode), dsv3-moe-dummy (DeepSeek-V3's fused MoE alone, full token grid, timed with the routing
# random weights give: every token's top-8 among the same 10 experts; `--load-format dummy`),
# dsv3-moe-depth (that fused MoE at the per-GPU slices of TP 8, 1 and 2, the --quick grid: the
# down GEMM's K 256, 2,048 and 1,024; MOE_TPS picks them; TP=N names the tables -tpN-),
# dsv3-8l-dummy-compose (the dsv3-8l whole steps composed again with that table: `--load-format
# dummy`), comm (`tuner profile comm` over this machine's GPUs; on one GPU the collectives are local
# copies: a check of the tool, not a table), hicache-write (`--ops hicache_write`: the scheduler
# thread's CPU time to issue one HiCache write-through backup of 1 to 32,768 tokens with SGLang's staged
# write-back, Qwen3-30B-A3B fp8 and bf16 KV, DeepSeek-V3 fp8 KV, page size 1). QUICK=0 times the full
# grid instead of --quick's coarse one. PROFILE_OPS (e.g. gemm,decode_attention) times only those
# operators in the profile steps.
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-540}
STEPS=${STEPS:-qwen3-bf16 qwen3-fp8}
QUICK=${QUICK:-1}
# GPU_DIR names the results folder of the card the call gets (with EXPECT_GPU, e.g. GPU_DIR=h100
# EXPECT_GPU=H100): tables are per GPU
GPU_DIR=${GPU_DIR:-h200}
HERE=results/profiles/$GPU_DIR
PROFILES=$HERE/tables
t0=$(date +%s)
LOGS=/tmp/call-logs-profile
rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS" "$HERE" "$PROFILES"
pack() {
  cp "$LOGS"/*.log "$LOGS"/*.csv "$HERE/" 2>/dev/null
  tar -czf "$OUT/profiles.tgz" "$PROFILES" "$HERE" 2>/dev/null
  jit_cache_save 2>/dev/null
}
trap pack EXIT
source results/h200-sglang/kit-setup.sh
expect_gpu || exit 3
kit_setup || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu-before.csv"
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
quick=""; [ "$QUICK" = 1 ] && quick="--quick"

# profile NAME MODEL ARGS...: the operator tables
profile() {
  local name=$1 model=$2; shift 2
  local l; l=$(left)
  [ "$l" -gt 60 ] || { echo "$name profile: skipped, only $l s left" | tee -a "$LOGS/steps.log"; return 1; }
  local ts; ts=$(date +%s)
  local ops=(); [ -n "${PROFILE_OPS:-}" ] && ops=(--ops "$PROFILE_OPS")
  timeout -s INT $(( l - 20 )) python3 -m tuner profile run --model "$model" --hardware "$GPU_DIR" $quick "$@" "${ops[@]}" \
    -o "$PROFILES/$model-tp${TP:-1}-$name-triton-0.5.17.json" > "$LOGS/profile-${LOG_TAG:-$name}.log" 2>&1
  local rc=$?
  echo "$name profile: rc $rc in $(( $(date +%s) - ts )) s" | tee -a "$LOGS/steps.log"
  tail -5 "$LOGS/profile-${LOG_TAG:-$name}.log"
  return $rc
}
# whole NAME MODEL QUANT: SGLang's one-batch benchmark on the same shapes (random weights; its
# tokenizer is not needed for synthetic inputs, so none is loaded), then the composition check.
# OVERRIDES (JSON: config.json keys, e.g. {"num_hidden_layers": 8}) runs a variant of the model,
# WHOLE_ARGS adds bench_one_batch flags (e.g. --kv-cache-dtype fp8_e4m3), TAG names its files.
whole() {
  local name=$1 model=$2 quant=$3 tag=${TAG:-$1}
  local l; l=$(left)
  [ "$l" -gt 120 ] || { echo "$tag whole steps: skipped, only $l s left" | tee -a "$LOGS/steps.log"; return; }
  local dir=/tmp/model-$tag rows="$HERE/whole-steps-$tag.jsonl" ts; ts=$(date +%s)
  python3 - "$model" "$quant" "$dir" "${OVERRIDES:-}" <<'PY'
import json
import sys
from tuner.profile import build_plan
from tuner.profile.modelcfg import write_model_dir
flags = {"tp-size": 1, "attention-backend": "triton"}
if sys.argv[2] != "none":
    flags["quantization"] = sys.argv[2]
model = {"name": sys.argv[1], "overrides": json.loads(sys.argv[4])} if sys.argv[4] else sys.argv[1]
p = build_plan(model, "h200", flags)
write_model_dir(p.model, p.ckpt, sys.argv[3])
PY
  rm -f "$rows"
  # prefill of batch x input tokens in one forward, decode medians over 32 steps; at most 64 x 2048
  # tokens of prefill, so the activations fit beside a 0.6 KV pool
  timeout -s INT $(( l - 40 )) python3 - "$dir" "$rows" ${WHOLE_ARGS:-} > "$LOGS/whole-$tag.log" 2>&1 <<'PY'
import sys
import sglang.benchmark.one_batch as one_batch
one_batch.get_tokenizer = lambda *a, **k: None
model_dir, rows, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.argv = ["one_batch", "--model-path", model_dir, "--load-format", "dummy", "--skip-tokenizer-init",
            "--attention-backend", "triton", "--sampling-backend", "pytorch", "--mem-fraction-static", "0.6",
            "--cuda-graph-max-bs", "64", "--batch-size", "1", "4", "16", "64", "--input-len", "256", "2048",
            "--output-len", "32", "--result-filename", rows, *extra]
one_batch.cli_main()
PY
  echo "$tag whole steps: rc $? in $(( $(date +%s) - ts )) s, $(wc -l < "$rows" 2>/dev/null || echo 0) rows" \
    | tee -a "$LOGS/steps.log"
  tail -5 "$LOGS/whole-$tag.log"
  if [ -s "$rows" ]; then
    local ov=()
    if [ -n "${OVERRIDES:-}" ]; then
      mapfile -t ov < <(python3 -c 'import json,sys
for k, v in json.loads(sys.argv[1]).items(): print("--model-override"); print(f"{k}={json.dumps(v)}")' "$OVERRIDES")
    fi
    python3 -m tuner profile compose --profile "$PROFILES/$model-tp1-$name-triton-0.5.17.json" --whole-steps "$rows" \
      "${ov[@]}" > "$LOGS/compose-$tag.log" 2>&1
    python3 -m tuner profile compose --profile "$PROFILES/$model-tp1-$name-triton-0.5.17.json" --whole-steps "$rows" \
      "${ov[@]}" --json > "$HERE/compose-$tag.json" 2>/dev/null
    cat "$LOGS/compose-$tag.log"
  fi
}
for step in $STEPS; do
  case $step in
    qwen3-bf16) profile bf16 qwen3-30b-a3b && whole bf16 qwen3-30b-a3b none ;;
    qwen3-fp8) profile fp8 qwen3-30b-a3b --quantization fp8 && whole fp8 qwen3-30b-a3b fp8 ;;
    qwen3-bf16-ops) profile bf16 qwen3-30b-a3b ;;
    qwen3-fp8-ops) profile fp8 qwen3-30b-a3b --quantization fp8 ;;
    qwen3-bf16-fp8kv) profile bf16-fp8kv qwen3-30b-a3b --kv-cache-dtype fp8_e4m3 ;;
    qwen3-fp8-fp8kv) profile fp8-fp8kv qwen3-30b-a3b --quantization fp8 --kv-cache-dtype fp8_e4m3 ;;
    dsv3-fp8) LOG_TAG=dsv3-fp8-fp8kv profile fp8-fp8kv deepseek-v3 --quantization fp8 --kv-cache-dtype fp8_e4m3 ;;
    hicache-write)  # the scheduler thread's CPU time per HiCache write-through backup (host-timed)
      QUICK_SAVED=$quick; quick=""
      LOG_TAG=qwen3-hostwrite-fp8kv profile fp8kv-hostwrite qwen3-30b-a3b --kv-cache-dtype fp8_e4m3 --ops hicache_write
      LOG_TAG=qwen3-hostwrite-bf16kv profile bf16kv-hostwrite qwen3-30b-a3b --ops hicache_write
      LOG_TAG=dsv3-hostwrite-fp8kv profile fp8kv-hostwrite deepseek-v3 --quantization fp8 --kv-cache-dtype fp8_e4m3 --ops hicache_write
      quick=$QUICK_SAVED ;;
    dsv3-8l-routing)  # distinct experts per MoE call in prefill and decode, random weights
      python3 - deepseek-v3 fp8 /tmp/model-routing '{"num_hidden_layers": 8}' <<'PY'
import json
import sys
from tuner.profile import build_plan
from tuner.profile.modelcfg import write_model_dir
p = build_plan({"name": sys.argv[1], "overrides": json.loads(sys.argv[4])}, "h200",
               {"tp-size": 1, "attention-backend": "triton", "quantization": sys.argv[2]})
write_model_dir(p.model, p.ckpt, sys.argv[3])
PY
      timeout -s INT $(( $(left) - 15 )) python3 results/profiles/h200/routing_probe.py /tmp/model-routing "$HERE/routing-dsv3-8l.json" \
        --kv-cache-dtype fp8_e4m3 --batch-size 64 --input-len 256 --output-len 4 > "$LOGS/routing-dsv3-8l.log" 2>&1
      echo "dsv3-8l-routing: rc $?" | tee -a "$LOGS/steps.log"; tail -8 "$LOGS/routing-dsv3-8l.log" ;;
    dsv3-8l-whole) TAG=dsv3-8l-fp8-fp8kv OVERRIDES='{"num_hidden_layers": 8}' WHOLE_ARGS="--kv-cache-dtype fp8_e4m3" \
                     whole fp8-fp8kv deepseek-v3 fp8 ;;
    dsv3-moe-depth)  # the same fused MoE at the moe-TP slices of TP 2 and 8 (K of the down GEMM 1024 and 256)
      for tp in ${MOE_TPS:-8 1 2}; do
        TP=$tp LOG_TAG=dsv3-moe-dummy-tp$tp profile fp8-fp8kv-dummy-moe deepseek-v3 --quantization fp8 \
          --kv-cache-dtype fp8_e4m3 --ops moe --load-format dummy --tp-size $tp
      done ;;
    dsv3-moe-dummy) QUICK_SAVED=$quick; quick=""
      LOG_TAG=dsv3-moe-dummy profile fp8-fp8kv-dummy-moe deepseek-v3 --quantization fp8 --kv-cache-dtype fp8_e4m3 \
        --ops moe --load-format dummy
      quick=$QUICK_SAVED ;;
    dsv3-8l-dummy-compose)
      for fmt in "" --json; do
        python3 -m tuner profile compose --profile "$PROFILES/deepseek-v3-tp1-fp8-fp8kv-triton-0.5.17.json" \
          --profile "$PROFILES/deepseek-v3-tp1-fp8-fp8kv-dummy-moe-triton-0.5.17.json" \
          --whole-steps "$HERE/whole-steps-dsv3-8l-fp8-fp8kv.jsonl" --model-override num_hidden_layers=8 \
          --load-format dummy $fmt > "$LOGS/compose-dsv3-8l-dummy${fmt:+.json}" 2>&1
      done
      mv "$LOGS/compose-dsv3-8l-dummy.json" "$HERE/" 2>/dev/null; cp "$LOGS/compose-dsv3-8l-dummy" "$LOGS/compose-dsv3-8l-dummy.log"
      cat "$LOGS/compose-dsv3-8l-dummy.log" ;;
    comm)
      n=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
      timeout -s INT -k 5 60 python3 -m tuner profile comm --gpus "$n" --hardware "$GPU_DIR" --sizes 4KiB,256KiB,16MiB,256MiB \
        --iters 10 --repeats 3 -o "$HERE/comm-${n}gpu-check.json" > "$LOGS/comm.log" 2>&1
      echo "comm: rc $?" | tee -a "$LOGS/steps.log"; tail -20 "$LOGS/comm.log" ;;
    *) echo "unknown step $step" | tee -a "$LOGS/steps.log" ;;
  esac
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader > "$LOGS/gpu-after.csv"
echo "call took $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/steps.log"
