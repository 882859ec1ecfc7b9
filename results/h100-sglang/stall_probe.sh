#!/usr/bin/env bash
# One device call: stall_probe.py (a fresh DeepSeek-5L server's stalls by request shape, then a
# second server on the kernel caches the first one left), logs and results in $OUT. Run from the
# repository root with carry [".sglkit/archives", ".sglkit/install.sh", ".whl"]:
#
#   OUT=$OUT LIMIT=540 bash results/h100-sglang/stall_probe.sh      # timeout_s 580
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-540}
t0=$(date +%s)
source results/h200-sglang/kit-setup.sh
probe_call_setup /tmp/call-logs-stall || exit $?
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
timeout -s INT $(( $(left) - 20 )) python3 results/h100-sglang/stall_probe.py --out "$OUT" \
  --servers "${SERVERS:-cold,warm}" 2>&1 | tee "$LOGS/stall-probe.log" | grep -v "^\[" | tail -20
python3 results/h100-sglang/stall_probe.py --out "$OUT" --report 2>&1 | tee "$LOGS/report.log"
gzip -f "$OUT"/server-*.log 2>/dev/null
echo "call took $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/steps.log"
