#!/usr/bin/env bash
# One device call: stall_probe.py (a fresh DeepSeek-5L server's stalls by request shape, then a
# second server on the kernel caches the first one left), logs and results in $OUT. Run from the
# repository root with carry [".sglkit/archives", ".sglkit/install.sh", ".whl"]:
#
#   OUT=$OUT LIMIT=540 bash results/h100-sglang/stall_probe.sh      # timeout_s 580
#
# STEPS=lone sends only the lone prompts; TRITON_DIR=DIR sets the servers' TRITON_CACHE_DIR (an
# absolute path); CACHES=1 also packs the kernel caches (Triton's and Inductor's, every kernel's IR
# and metadata) into $OUT/kernel-caches.tgz; LONE=1,4,16 picks the lone prompts' lengths; NO_GRAPH=1
# starts the servers without CUDA graphs. A call brings back at most
# 8 files: the small logs travel in $OUT/logs.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-540}
t0=$(date +%s)
source results/h200-sglang/kit-setup.sh
JIT_CACHE_MAX_BYTES=0  # the caches, where wanted, come back whole in kernel-caches.tgz
probe_call_setup /tmp/call-logs-stall || exit $?
trap 'cp "$OUT"/gpu.csv "$LOGS"/ 2>/dev/null; rm -f "$OUT"/gpu.csv; tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
timeout -s INT $(( $(left) - 25 )) python3 results/h100-sglang/stall_probe.py --out "$OUT" \
  --servers "${SERVERS:-cold,warm}" ${TRITON_DIR:+--triton-cache-dir "$TRITON_DIR"} ${LONE:+--lone "$LONE"} ${NO_GRAPH:+--no-cuda-graph} --steps "${STEPS:-lone,extend,burst,decode,join}" 2>&1 \
  | tee "$LOGS/stall-probe.log" | grep -v "^\[" | tail -20
python3 results/h100-sglang/stall_probe.py --out "$OUT" --report 2>&1 | tee "$LOGS/report.log"
gzip -f "$OUT"/server-*.log 2>/dev/null
if [ -n "${CACHES:-}" ]; then
  (cd / && tar -czf "$OUT/kernel-caches.tgz" root/.triton/cache ${TRITON_DIR:+${TRITON_DIR#/}} $(ls -d tmp/torchinductor_*/triton 2>/dev/null)) \
    && echo "kernel caches packed: $(stat -c %s "$OUT/kernel-caches.tgz") bytes" | tee -a "$LOGS/steps.log"
fi
echo "call took $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/steps.log"
