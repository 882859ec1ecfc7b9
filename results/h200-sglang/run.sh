#!/usr/bin/env bash
# One device call on the H200 machine: install SGLang 0.5.17 (the kit), Ray and tuner's own wheels,
# then start or resume ONE study for at most LIMIT seconds, and leave its database, logs,
# /server_info snapshots and status under $OUT. Run from the repository root:
#
#   OUT=/tmp/out STUDY=h200-sglang-qwen3 LIMIT=480 TRIALS=9 bash results/h200-sglang/run.sh
#
# STEPS (default "study") may also name "verify" (first): export the study's best trial for SGLang
# 0.5.17, start it with `sglang serve --config` and replay the workload at its capacity
# (`tuner study verify-export`); the study then gets the time that is left. CAPACITY_START=simulator
# resumes the study with each new trial's capacity search starting at the simulator's prediction;
# VERIFY_TRIAL=N checks trial N instead of the best; VERIFY_REF=N compares with trial N, a repeat of
# its configuration; VERIFY_USERS=U replays U users. FIRST_WARMUP_S=45 gives a fresh server's first load point that much warm-up; RESUME_ARGS adds
# other `study resume` options (e.g. --no-pruning). "tiles-ab": the serving A/B of MoE tile configs
# (`tuner study tiles-ab`, TILES_TRIAL, TILES_USERS, TILES_DIR: the tuned files, default
# results/kernels/h200/sglang; TILES_VARIANTS: which variants in which order, default "default,tuned";
# after verify, before the study).
# "probe" (last) spends the time left on planner probes (`tuner bench planner-probe`, PROBES names
# them: "--only A --only B"), packed into $OUT/planner.tgz; a probe cut off by the limit is retried
# in a later call. PROBE_GPU=h100 probes probes/planner-matrix-h100.yaml into results/h100-planner.
#
# Needs, in the checkout (ignored by git): .sglkit/ (the kit, without archives/hf.tar.xz) and .whl/
# (optuna, alembic, mako, colorlog, sqlalchemy wheels for Python 3.12, or pylibs.tar.xz: the same
# installed with `pip install --no-deps --no-compile --target DIR` and packed); see README.md beside this file.
set -uo pipefail
STUDY=${STUDY:?name of a studies/*.yaml}
LIMIT=${LIMIT:-480}
# the machine kills a call at 600 s (or at the call's own timeout) and then nothing under $OUT comes
# back but what is there: every backstop below ends its step by HARD s, which leaves the database
# copy and the packing 15 s. A call with a shorter timeout must set HARD 15 s below it.
HARD=${HARD:-585}
STEPS=${STEPS:-study}
OUT=${OUT:-/tmp/out}
# RESULTS: where the study database lives (results/h100-sglang for a study on an H100)
RESULTS=${RESULTS:-results/h200-sglang}
DB="$RESULTS/$STUDY.db"
mkdir -p "$RESULTS"
t0=$(date +%s)
# at most 8 files come back from a call: the small ones are written under $LOGS and packed into
# $OUT/call-logs-$STUDY.tgz on the way out (also when the call fails early), so that one call may
# run this script for two studies one after the other
LOGS=/tmp/call-logs-$STUDY
rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS"
trap 'tar -czf "$OUT/call-logs-$STUDY.tgz" -C "$LOGS" . 2>/dev/null' EXIT
# the kit, Ray and the study's libraries (skipped on a warm machine that has them already)
source results/h200-sglang/kit-setup.sh
expect_gpu || exit 3
KIT_RAY=1 kit_setup || exit 1
# unbuffered: a call cut off by the machine's limit still brings back every line written so far
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 TUNER_HEARTBEAT_GRACE_S=15 PYTHONUNBUFFERED=1
python3 - > "$LOGS/versions.txt" 2>&1 <<'PY' &
import importlib.metadata as m, sys, time
t = time.time()
import sglang, ray, optuna, sqlalchemy, transformers, torch, tuner  # noqa: F401
print(f"python {sys.version.split()[0]} sglang {m.version('sglang')} ray {ray.__version__} optuna {optuna.__version__} "
      f"torch {torch.__version__} transformers {transformers.__version__} cuda {torch.cuda.is_available()} "
      f"({time.time() - t:.1f} s to import)")
PY
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu-before.csv"
free -g | head -2
STORE="sqlite:///$DB"
if [[ " $STEPS " == *" verify "* ]]; then
  which=(); [ -n "${VERIFY_TRIAL:-}" ] && which=(--trial "$VERIFY_TRIAL")  # default: the best
  python3 -m tuner study export "$STUDY" --storage "$STORE" -o "$LOGS/best-$STUDY.yaml" --sglang-version 0.5.17 \
    "${which[@]}" 2>&1 | tee "$LOGS/export.log"
  # VERIFY_REF=N compares against trial N, a repeat of the same configuration; VERIFY_USERS=U replays U users
  [ -n "${VERIFY_REF:-}" ] && which+=(--reference-trial "$VERIFY_REF")
  [ -n "${VERIFY_USERS:-}" ] && which+=(--users "$VERIFY_USERS")
  # the check gets what the call has left (less packing) unless a study follows it; a HiCache
  # configuration alone takes 210 s to answer (its 87 GB host pool is pinned in 107 s)
  verify_s=$(( LIMIT - ($(date +%s) - t0) - 25 )); [[ " $STEPS " == *" study "* ]] && verify_s=${VERIFY_S:-330}
  timeout -s INT "$verify_s" python3 -m tuner study verify-export "$STUDY" "$LOGS/best-$STUDY.yaml" --storage "$STORE" \
    "${which[@]}" -o "$LOGS/export-check.json" 2>&1 | tee "$LOGS/export-check.log"
  echo "verify took $(( $(date +%s) - t0 )) s since the call began"
fi
if [[ " $STEPS " == *" tiles-ab "* ]]; then
  # serving A/B of MoE tile configs (`tuner study tiles-ab`): trial TILES_TRIAL's configuration (default:
  # the best) with SGLang's own tiles, then with the tuned ones, at TILES_USERS (default 16,24); the
  # load points land in $LOGS/tiles-ab/ for `tuner kernels refit-serving`, and as probe files
  # (<variant>.probe.json) for `tuner bench fidelity`
  which=(); [ -n "${TILES_TRIAL:-}" ] && which=(--trial "$TILES_TRIAL")
  ab_s=$(( LIMIT - ($(date +%s) - t0) - 25 )); [[ " $STEPS " == *" study "* ]] && ab_s=${TILES_AB_S:-420}
  timeout -s INT "$ab_s" python3 -m tuner study tiles-ab "$STUDY" --storage "$STORE" --users "${TILES_USERS:-16,24}" \
    "${which[@]}" --tuned-dir "${TILES_DIR:-results/kernels/h200/sglang}" --variants "${TILES_VARIANTS:-default,tuned}" \
    -o "$LOGS/tiles-ab.json" --refit-points "$LOGS/tiles-ab" --probes "$LOGS/tiles-ab" 2>&1 | tee "$LOGS/tiles-ab.log"
  echo "tiles-ab took $(( $(date +%s) - t0 )) s since the call began"
fi
[[ " $STEPS " == *" study "* ]] || STUDY_SKIP=1
# the study's own limit ends 30 s before the backstop below, so that its trial's teardown is not cut
[ "$LIMIT" -gt $(( HARD - 70 )) ] && LIMIT=$(( HARD - 70 ))
left=$(( LIMIT - ($(date +%s) - t0) ))
# --time-limit starts no load point that cannot end within it and lets the running one finish;
# Ctrl-C (SIGINT) is the backstop, 75 s later or at HARD less 40 s, whichever comes first (its servers'
# teardown gets 25 s, then SIGKILL), so that the database always comes back
backstop=$(( left + 75 )); hard_left=$(( HARD - 40 - ($(date +%s) - t0) ))
[ "$hard_left" -lt "$backstop" ] && backstop=$hard_left
if [ -n "${STUDY_SKIP:-}" ] || [ "$left" -lt 120 ]; then
  echo "no study run: ${STUDY_SKIP:+not in STEPS}${STUDY_SKIP:-only $left s left}"
elif [ -f "$DB" ] && python3 -m tuner study status "$STUDY" --storage "sqlite:///$DB" --json > /dev/null 2>&1; then
  timeout -s INT -k 25 "$backstop" python3 -m tuner study resume "$STUDY" --storage "sqlite:///$DB" \
    --time-limit "$left" ${TRIALS:+--trials $TRIALS} ${CAPACITY_START:+--capacity-start $CAPACITY_START} \
    ${FIRST_WARMUP_S:+--first-warmup-s $FIRST_WARMUP_S} ${RESUME_ARGS:-} \
    2>&1 | tee "$LOGS/study.log"
else
  timeout -s INT -k 25 "$backstop" python3 -m tuner study start "studies/$STUDY.yaml" --storage "sqlite:///$DB" \
    --time-limit "$left" ${TRIALS:+--trials $TRIALS} 2>&1 | tee "$LOGS/study.log"
fi
if [[ " $STEPS " == *" probe "* ]]; then
  left=$(( LIMIT - ($(date +%s) - t0) ))
  if [ "$left" -gt 90 ]; then
    timeout -s INT "$left" python3 -m tuner bench planner-probe "probes/planner-matrix-${PROBE_GPU:-h200}.yaml" \
      --out "results/${PROBE_GPU:-h200}-planner" ${PROBES:-} 2>&1 | tee "$LOGS/planner-probe.log"
  fi
  tar -czf "$OUT/planner.tgz" -C results "${PROBE_GPU:-h200}-planner" 2>/dev/null
fi
python3 -m tuner study status "$STUDY" --storage "sqlite:///$DB" --json > "$LOGS/status.json" 2>&1
cp "$DB" "$OUT/"
jit_cache_save
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader > "$LOGS/gpu-after.csv"
# logs, --config YAML, rendered config.json and /server_info of every trial (PID files left out)
tar -czf "$OUT/runs-$STUDY.tgz" --exclude='*.pids.json' --exclude='*/moe/configs' --exclude='*/sglang-site' -C results/runs $(cd results/runs && ls -d "$STUDY" "$STUDY"-export-check "$STUDY"-tiles-ab 2>/dev/null) 2>/dev/null
wait
ls -la "$OUT" "$LOGS"
echo "call took $(( $(date +%s) - t0 )) s"
