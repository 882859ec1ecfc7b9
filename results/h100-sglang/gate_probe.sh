#!/usr/bin/env bash
# One device call: gate_probe.py (does a HiCache backup wait for the step launched behind it?) on
# whichever GPU the call gets, HiCache off then on, server logs and results in $OUT. Run from the
# repository root with carry [".sglkit/archives", ".sglkit/install.sh", ".whl"]:
#
#   OUT=$OUT LIMIT=400 bash results/h100-sglang/gate_probe.sh      # timeout_s 430
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-400}
source results/h200-sglang/kit-setup.sh
probe_call_setup /tmp/call-logs-gate || exit $?
timeout -s INT $(( LIMIT - 20 )) python3 results/h100-sglang/gate_probe.py --out "$OUT" --reps "${REPS:-8}" --modes "${MODES:-off,on}" 2>&1 \
  | tee "$LOGS/gate-probe.log" | grep -v "^\[" | tail -20
python3 results/h100-sglang/gate_probe.py --out "$OUT" --report 2>&1 | tee "$LOGS/report.log"
