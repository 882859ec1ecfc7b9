#!/usr/bin/env bash
# One device call on the H200 machine: tune SGLang 0.5.17's own kernels for the studies' models with
# `tuner kernels tune`, every shape into this one folder (committed; trials with moe-tile-configs:
# tuned read it through backend_options.moe_config_dir), and pack the results into $OUT/kernels.tgz.
# A later call with the same steps continues each shape from state/ (finished batch sizes are kept).
# Run from the repository root with carry [".sglkit", ".whl"] (optuna drives the search):
#
#   OUT=$OUT LIMIT=540 STEPS="qwen3-bf16 qwen3-fp8-moe qwen3-fp8-gemm" bash results/kernels/h200/sglang/run.sh
#
# Layout of this folder (README.md): configs/triton_3_6_0/ (MoE files, SGLANG_MOE_CONFIG_DIR),
# gemm_configs/ (block-fp8 GEMM files), reports/<shape>.json, state/<shape>.jsonl, summary.json
# (every shape's report, merged), logs/call-N/ (this call's logs, N counted on).
#
# STEPS, in order (each gets at most its DEADLINE_<step> seconds of new batch sizes and the call's
# time that is left, stopping between batch sizes):
#   qwen3-bf16      fused MoE of Qwen3-30B-A3B bf16 at TP1 (E=128, N=768; bar: SGLang's shipped file)
#   qwen3-fp8-moe   the same fp8 block-quantized (SGLang ships only a triton_3_2_0 fallback)
#   qwen3-fp8-gemm  its block-fp8 linear layers (w8a8_block_fp8_matmul: qkv N=5120,K=2048, then o_proj
#                   N=2048,K=4096)
#   qwen3-fp8-oproj the o_proj GEMM alone (when qwen3-fp8-gemm keeps spending its time on qkv)
#   dsv3-fp8-moe    DeepSeek-V3 fp8 at TP1 (E=257 with the fused shared expert, N=2048; no shipped file)
#   dsv3-fp8-moe-collapsed the same under the routing of the dummy-weight DeepSeek server (`--routing
#                   collapsed`), into collapsed/ (trials read it with tiles-ab TILES_DIR); COLLAPSED_BS
#                   (default 16,128,512,2048), COLLAPSED_BUDGET / COLLAPSED_DOWN_BUDGET (default 64 / 26:
#                   5% of the spaces)
#   dsv3-fp8-moe-capped DeepSeek-V3's shape again under the default 15-minute cap (`--shape-time-s`,
#                   SHAPE_TIME_S, default 900) from a cold Triton cache of its own (CAPPED_CACHE, default
#                   /tmp/triton-capped: kept on a warm machine, so the next call continues as one tune would),
#                   into capped/ (CAPPED_DIR: another folder, e.g. for another GPU); two calls finish it. Its files against the uncapped ones: compare-dsv3
#                   with COMPARE_DIR=capped COMPARE_ROUTINGS=serving beside compare/dsv3-serving.json
#   grid-qwen3-bf16 search against SGLang's exhaustive grid (GRID_BS batch sizes, default 1,64), into
#                   grid/ (a benchmark, not trial files: its file covers only GRID_BS, and the tuned
#                   folder refuses a shape tuned with other settings)
#   grid-qwen3-fp8-oproj the same benchmark for the o_proj block-fp8 GEMM (N=2048, K=4096; 1,280 configs),
#                   GRID_BS default 16,32,64,128,512,2048: Triton builds one binary per config for every M
#                   divisible by 16, so the grid compiles its space once and then only times (~11 ms a config)
#   compare-dsv3    DeepSeek-V3's tuned files (this folder, or its COMPARE_DIR; COMPARE_DIRS: several) against SGLang's default, timed side by side
#                   (DIR:served in COMPARE_DIRS: the copy a trial serves, --as-served)
#                   with `tuner kernels compare` under each of COMPARE_ROUTINGS (default: collapsed, the
#                   dummy-weight server's, then serving) at COMPARE_BS, into compare/dsv3-<routing>.json
#   gpu-tests       pytest -m gpu tests/kernels_tests, with the server-load test
#                   (GPU_TESTS_K selects tests by pytest's -k expression)
#   cache-check     cache_check.py (CACHE_CHECK_ARGS): which binaries the timer builds after a pool
#                   process compiled the same config on the stand-in
# BATCH_SIZES overrides the batch sizes of the tuning steps (default below: the decode batches and
# prefill chunks the studies run, 9 of SGLang's 18).
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-540}
STEPS=${STEPS:-qwen3-bf16 qwen3-fp8-moe qwen3-fp8-gemm}
BATCH_SIZES=${BATCH_SIZES:-1,4,16,32,64,128,512,2048,4096}
HERE=results/kernels/h200/sglang
t0=$(date +%s)
LOGS=/tmp/call-logs
rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS"
mkdir -p "$HERE/logs"
CALL=$(( $(find "$HERE/logs" -maxdepth 1 -name 'call-*' -type d | wc -l) + 1 ))
# the compiled tile candidates, kept between calls: a batch size compiles only the configs no earlier
# one did (of M=128's 180 candidates, 54 had not been timed at M=1..64), and compiling was 116 s of
# M=128's 125. Carried when it fits (KERNEL_CACHE_MAX_BYTES; the size is logged either way)
export JIT_CACHE_ARCHIVE=.jitcache/triton-kernels.tar.xz JIT_CACHE_MAX_BYTES=${KERNEL_CACHE_MAX_BYTES:-24000000}
pack() {
  jit_cache_save 2>/dev/null
  mkdir -p "$HERE/logs/call-$CALL"
  cp "$LOGS"/*.log "$LOGS"/*.csv "$HERE/logs/call-$CALL/" 2>/dev/null
  tar -czf "$OUT/kernels.tgz" --exclude='*.pyc' "$HERE" 2>/dev/null
  tar -czf "$OUT/call-logs.tgz" -C "$LOGS" . 2>/dev/null
}
trap pack EXIT
source results/h200-sglang/kit-setup.sh
expect_gpu || exit 3
kit_setup || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu-before.csv"

left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
# tune STEP DIR DEADLINE ARGS...: new batch sizes start until DEADLINE (or the call's time left, less
# the time a batch size may take), and SIGINT is the backstop at the call's end
tune() {
  local step=$1 dir=$2 deadline=$3; shift 3
  local l; l=$(left)
  [ "$l" -gt 90 ] || { echo "$step: skipped, only $l s left" | tee -a "$LOGS/steps.log"; return; }
  [ "$deadline" -lt $(( l - 75 )) ] || deadline=$(( l - 75 ))
  echo "$step: deadline $deadline s, $l s left in the call" | tee -a "$LOGS/steps.log"
  local ts; ts=$(date +%s)
  timeout -s INT $(( l - 10 )) python3 -m tuner kernels tune --impl sglang --deadline-s "$deadline" "$@" \
    -o "$dir" > "$LOGS/$step.log" 2>&1
  echo "$step: rc $? in $(( $(date +%s) - ts )) s" | tee -a "$LOGS/steps.log"
  tail -30 "$LOGS/$step.log"
}
for step in $STEPS; do
  case $step in
    qwen3-bf16) tune "$step" "$HERE" "${DEADLINE_qwen3_bf16:-200}" --model qwen3-30b-a3b --tp-size 1 --dtype bf16 \
                  --kernel moe --batch-sizes "$BATCH_SIZES" ;;
    qwen3-fp8-moe) tune "$step" "$HERE" "${DEADLINE_qwen3_fp8_moe:-150}" --model qwen3-30b-a3b --tp-size 1 \
                  --dtype fp8_w8a8 --block-shape 128,128 --kernel moe --batch-sizes "$BATCH_SIZES" ;;
    qwen3-fp8-gemm) tune "$step" "$HERE" "${DEADLINE_qwen3_fp8_gemm:-60}" --model qwen3-30b-a3b --tp-size 1 \
                  --dtype fp8_w8a8 --block-shape 128,128 --kernel gemm --batch-sizes "$BATCH_SIZES" ;;
    qwen3-fp8-oproj) tune "$step" "$HERE" "${DEADLINE_qwen3_fp8_oproj:-60}" --model qwen3-30b-a3b --tp-size 1 \
                  --dtype fp8_w8a8 --block-shape 128,128 --kernel gemm --gemm-shape 2048,4096 --batch-sizes "$BATCH_SIZES" ;;
    dsv3-fp8-moe) tune "$step" "$HERE" "${DEADLINE_dsv3_fp8_moe:-300}" --model deepseek-v3 --tp-size 1 \
                  --dtype fp8_w8a8 --block-shape 128,128 --kernel moe --batch-sizes "$BATCH_SIZES" ;;
    dsv3-fp8-moe-collapsed) tune "$step" "$HERE/collapsed" "${DEADLINE_dsv3_collapsed:-400}" --model deepseek-v3 \
                  --tp-size 1 --dtype fp8_w8a8 --block-shape 128,128 --kernel moe --routing collapsed \
                  --batch-sizes "${COLLAPSED_BS:-16,128,512,2048}" --budget "${COLLAPSED_BUDGET:-64}" \
                  --down-budget "${COLLAPSED_DOWN_BUDGET:-26}" ;;
    dsv3-fp8-moe-capped) TRITON_CACHE_DIR=${CAPPED_CACHE:-/tmp/triton-capped} tune "$step" "$HERE/${CAPPED_DIR:-capped}" \
                  "${DEADLINE_dsv3_capped:-480}" --model deepseek-v3 --tp-size 1 --dtype fp8_w8a8 --block-shape 128,128 \
                  --kernel moe --batch-sizes "$BATCH_SIZES" --shape-time-s "${SHAPE_TIME_S:-900}" ;;
    grid-qwen3-bf16) tune "$step" "$HERE/grid" "${DEADLINE_grid:-400}" --model qwen3-30b-a3b --tp-size 1 --dtype bf16 \
                  --kernel moe --batch-sizes "${GRID_BS:-1,64}" --grid --down-budget 0 ;;
    grid-qwen3-fp8-oproj) tune "$step" "$HERE/grid" "${DEADLINE_grid:-450}" --model qwen3-30b-a3b --tp-size 1 \
                  --dtype fp8_w8a8 --block-shape 128,128 --kernel gemm --gemm-shape 2048,4096 \
                  --batch-sizes "${GRID_BS:-16,32,64,128,512,2048}" --grid ;;
    compare-dsv3) mkdir -p "$HERE/compare"
               # COMPARE_DIRS: several folders in one call ("." is this one), e.g. "capped ." times the
               # capped files and the uncapped ones against the same default on the same machine
               # a folder written DIR:served times the copy a trial serves (--as-served: filled with SGLang's
               # own entries where the tune left batch sizes uncovered), into compare/dsv3-DIR-served-<routing>.json
               for spec in ${COMPARE_DIRS:-${COMPARE_DIR:-.}}; do
               d=${spec%:served}; served=""; [ "$d" = "$spec" ] || served="--as-served"
               suffix=""; [ "$d" = . ] || suffix="-$d"; [ -z "$served" ] || suffix="$suffix-served"
               suffix="$suffix${COMPARE_TAG:-}"  # e.g. COMPARE_TAG=-gaps keeps another batch-size list apart
               for r in ${COMPARE_ROUTINGS:-collapsed serving}; do
                 l=$(left); [ "$l" -gt 60 ] || { echo "$step $spec $r: skipped, only $l s left" | tee -a "$LOGS/steps.log"; continue; }
                 ts=$(date +%s)
                 timeout -s INT $(( l - 10 )) python3 -m tuner kernels compare --model deepseek-v3 --tp-size 1 \
                   --dtype fp8_w8a8 --block-shape 128,128 --configs "$HERE/$d" --routing "$r" $served \
                   --batch-sizes "${COMPARE_BS:-16,64,128,256,512,1024}" \
                   -o "$HERE/compare/dsv3$suffix-$r.json" \
                   > "$LOGS/$step$suffix-$r.log" 2>&1
                 echo "$step $spec $r: rc $? in $(( $(date +%s) - ts )) s" | tee -a "$LOGS/steps.log"; tail -12 "$LOGS/$step$suffix-$r.log"
               done
               done ;;
    cache-check) l=$(left); [ "$l" -gt 60 ] || { echo "cache-check: skipped, only $l s left" | tee -a "$LOGS/steps.log"; continue; }
               timeout -s INT $(( l - 10 )) python3 "$HERE/cache_check.py" ${CACHE_CHECK_ARGS:---shape dsv3 --M 2} \
                 > "$LOGS/cache-check.log" 2>&1
               echo "cache-check: rc $?" | tee -a "$LOGS/steps.log"; tail -40 "$LOGS/cache-check.log" ;;
    gpu-tests) l=$(left); [ "$l" -gt 120 ] || { echo "gpu-tests: skipped, only $l s left" | tee -a "$LOGS/steps.log"; continue; }
               timeout -s INT $(( l - 10 )) env TUNER_GPU_SERVER_TEST=1 python3 -m pytest -q -m gpu \
                  tests/kernels_tests -p no:cacheprovider ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} > "$LOGS/gpu-tests.log" 2>&1
               echo "gpu-tests: rc $?" | tee -a "$LOGS/steps.log"; tail -15 "$LOGS/gpu-tests.log" ;;
    *) echo "unknown step $step" | tee -a "$LOGS/steps.log" ;;
  esac
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader > "$LOGS/gpu-after.csv"
echo "call took $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/steps.log"
