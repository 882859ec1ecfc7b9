#!/usr/bin/env bash
# One H200 session, run from the repository root with OUT set (everything lands under $OUT, each
# part as soon as it is done, so a run stopped at its limit keeps what finished):
#   (a) the tiny-h200 study: transformers serve trials on the GPU, in-process (no Ray);
#   (b) the fused-MoE grid at batch sizes 1024 and 4096 for GLM-5.1 FP8 TP8, with the rest of the time.
#
#   OUT=/tmp/out CALL_S=575 STUDY_S=285 bash results/h200-transformers/run.sh
set -u
T0=$(date +%s)
CALL_S=${CALL_S:-575}     # the whole script ends within this many seconds
STUDY_S=${STUDY_S:-285}   # hard limit for part (a)
STUDY=${STUDY:-tiny-h200}         # name or path of the study file
STUDY_NAME=${STUDY_NAME:-$STUDY}
OUT=${OUT:-/tmp/out}
DB=${DB:-sqlite:////tmp/tuner-h200.db}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/kernels"
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el) s] $*" | tee -a "$OUT/run.log"; }
smi() { nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu,driver_version --format=csv,noheader 2>&1 || true; }

log "GPU before: $(smi)"
python3 - <<'EOF' 2>&1 | tee -a "$OUT/run.log"
import importlib
for m in ("torch", "transformers", "fastapi", "starlette", "pydantic", "uvicorn", "openai", "optuna", "sqlalchemy"):
    mod = importlib.import_module(m)
    print(m, getattr(mod, "__version__", "?"), mod.__file__)
EOF

# ---- (a) the study --------------------------------------------------------------------------
log "study $STUDY: start (limit ${STUDY_S} s)"
timeout -s INT -k 30 "$STUDY_S" python3 -m tuner study start "$STUDY" --backend transformers --no-ray \
    --storage "$DB" >"$OUT/study.log" 2>&1
log "study exit $? ; GPU after: $(smi)"
# servers a killed driver left behind: only processes tuner launched (they carry its token), by PID
python3 - <<'EOF' 2>&1 | tee -a "$OUT/run.log"
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if b"TUNER_PROCESS_TOKEN=" in open(f"/proc/{pid}/environ", "rb").read() and int(pid) != os.getpid():
            os.kill(int(pid), signal.SIGKILL)
            print("reaped leftover server", pid)
    except OSError:
        pass
EOF
mkdir -p results/runs/export
python3 -m tuner study status "$STUDY_NAME" --storage "$DB" --json >results/runs/export/status.json 2>>"$OUT/run.log"
python3 -m tuner study export "$STUDY_NAME" --storage "$DB" -o results/runs/export/best.yaml >>"$OUT/run.log" 2>&1
cp "${DB#sqlite:///}" "$OUT/tuner-h200.db"
smi >results/runs/export/nvidia-smi-after-study.csv
tar czf "$OUT/study-files.tar.gz" --exclude='*.safetensors' results/runs 2>>"$OUT/run.log"
log "study files saved"

# ---- (b) the kernel grid ----------------------------------------------------------------------
LEFT=$(( CALL_S - $(el) - 20 ))
log "kernel grid: ${LEFT} s left"
if [ "$LEFT" -gt 60 ]; then
    timeout -k 5 "$(( LEFT + 10 ))" python3 -m tuner kernels benchmark --model glm-5.1 --tp-size 8 \
        --dtype fp8_w8a8 --block-shape 128,128 --batch-sizes 1024,4096 --grid-only \
        --found-from results/kernels/h200/summary.json --deadline-s "$LEFT" -o "$OUT/kernels" \
        >"$OUT/kernels/bench.log" 2>&1
    log "kernel grid exit $?"
fi
log "done"
