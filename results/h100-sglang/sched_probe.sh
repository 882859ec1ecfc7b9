#!/usr/bin/env bash
# One device call: sched_probe.py (the scheduler's CPU per decode step and per running request: the
# study's server flags with 2 of Qwen3-30B-A3B's layers, then all 48, at 1-96 requests decoding side
# by side) on whichever GPU the call gets; logs and results in $OUT. Run from the repository root
# with carry [".sglkit/archives", ".sglkit/install.sh", ".whl"]:
#
#   OUT=$OUT LIMIT=300 GPU=h100 bash results/h100-sglang/sched_probe.sh      # timeout_s 330
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-300}
GPU=${GPU:-h100}
t0=$(date +%s)
source results/h200-sglang/kit-setup.sh
probe_call_setup /tmp/call-logs-sched || exit $?
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
timeout -s INT $(( $(left) - 20 )) python3 results/h100-sglang/sched_probe.py --out "$OUT" --gpu "$GPU" \
  --servers "${SERVERS:-thin,full}" --layers "${LAYERS:-2}" --prompt-tokens "${PROMPT:-64}" \
  --concurrency "${CONCURRENCY:-1,2,4,8,16,32,64,96}" --result "${RESULT:-sched-probe.json}" ${FLAGS:-} 2>&1 | tee "$LOGS/sched-probe.log" | grep -v "^\[" | tail -30
python3 results/h100-sglang/sched_probe.py --out "$OUT" --report 2>&1 | tee "$LOGS/report.log"
echo "call took $(( $(date +%s) - t0 )) s"
