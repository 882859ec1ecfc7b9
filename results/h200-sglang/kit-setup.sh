#!/usr/bin/env bash
# Sourced by the device scripts (run from the repository root): install SGLang 0.5.17 from the kit
# (.sglkit/, without archives/hf.tar.xz) into /tmp/site, and with KIT_RAY=1 also Ray and the study's
# Python libraries (.whl/pylibs.tar.xz, or the wheels in .whl/), then export PYTHONPATH and PATH.
# A warm machine keeps /tmp/site between calls: a marker skips the unpacking then.
# Writes its log to $LOGS/install.log; returns non-zero when anything failed.
# expect_gpu: stop the call at once when the GPU is not the one the results are for (EXPECT_GPU, default
# H200; empty: any), before the install: a call may be given another card, and these folders' tile
# files and timings are per GPU
expect_gpu() {
  local want=${EXPECT_GPU-H200} name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [ -z "$want" ] && return 0
  case "$name" in
    *"$want"*) return 0 ;;
    *) echo "this machine's GPU is '${name:-none found}', not $want (EXPECT_GPU=$want; EXPECT_GPU= runs anyway): stopping" >&2
       return 1 ;;
  esac
}

kit_setup() {
  local t0 marker="/tmp/site/.tuner-kit-with-libs-ray${KIT_RAY:-0}" ray_pid="" libs_pid=""
  t0=$(date +%s)
  mkdir -p /tmp/site "$LOGS"
  if [ -f "$marker" ]; then
    echo "kit already installed on this machine ($marker)" | tee -a "$LOGS/install.log"
  else
    if [ "${KIT_RAY:-0}" = 1 ]; then  # beside the kit's own archives (different folders; xz is single-threaded)
      tar -xJf .sglkit/ray/ray-2.60.0-slim.tar.xz -C /tmp/site & ray_pid=$!
    fi
    if [ -f "/tmp/site/.tuner-libs" ]; then :
    else
      if [ -f .whl/pylibs.tar.xz ]; then  # the wheels installed beforehand and packed (1 MB smaller)
        tar -xJf .whl/pylibs.tar.xz -C /tmp/site & libs_pid=$!
      else
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
          >> "$LOGS/install.log" 2>&1 & libs_pid=$!
      fi
    fi
    if [ -f /tmp/site/sglang/__init__.py ]; then echo "SGLang already unpacked" >> "$LOGS/install.log"
    else SGLKIT_NO_HF=1 bash .sglkit/install.sh >> "$LOGS/install.log" 2>&1 || { tail -20 "$LOGS/install.log"; return 1; }
    fi
    { [ -z "$ray_pid" ] || wait "$ray_pid"; } && { [ -z "$libs_pid" ] || wait "$libs_pid"; } \
      || { echo "unpacking Ray or the libraries failed"; tail -20 "$LOGS/install.log"; return 1; }
    touch /tmp/site/.tuner-libs
    touch "$marker"
  fi
  jit_cache_restore
  echo "installed in $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/install.log"
  export PYTHONPATH="/tmp/site:$PWD" PATH="/usr/local/cuda/bin:/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
}

# Triton's on-disk kernel cache, carried between calls (.jitcache/triton-cache.tar.xz, ignored by git,
# named in carry): a fresh machine otherwise compiles every kernel again (25 s more of decode-graph
# capture for the first trial of a call, and compile stalls in its first traffic that later servers
# of the same call do not have). Merged into what the machine holds (a machine kept warm between a
# serving and a kernel call has the other call's cache: restoring onto empty caches only let the
# kernel call pack the serving call's cache in place of its own); a broken archive is skipped.
# a kernel-tuning call keeps its own archive (JIT_CACHE_ARCHIVE=.jitcache/triton-kernels.tar.xz, a
# larger JIT_CACHE_MAX_BYTES: it carries no Ray), which comes back as $OUT/<its name>
JIT_CACHE_ARCHIVE=${JIT_CACHE_ARCHIVE:-.jitcache/triton-cache.tar.xz}
JIT_CACHE_MAX_BYTES=${JIT_CACHE_MAX_BYTES:-4000000}  # what the 64 MiB a call carries leaves room for
jit_cache_restore() {
  local dir="${TRITON_CACHE_DIR:-$HOME/.triton/cache}"
  if [ -f "$JIT_CACHE_ARCHIVE" ]; then
    mkdir -p "$dir"
    if tar -xJf "$JIT_CACHE_ARCHIVE" -C "$dir" --skip-old-files 2>>"$LOGS/install.log"; then
      echo "Triton cache restored: $(find "$dir" -type f | wc -l) files from $JIT_CACHE_ARCHIVE" | tee -a "$LOGS/install.log"
    else
      echo "Triton cache archive unreadable, starting cold" | tee -a "$LOGS/install.log"
    fi
  fi
}
# pack the cache into $OUT when it fits the carry budget; its size is said either way
jit_cache_save() {
  local dir="${TRITON_CACHE_DIR:-$HOME/.triton/cache}" tmp="$OUT/.triton-cache.tar.xz"
  [ -d "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ] || return 0
  if tar -cf - -C "$dir" . 2>/dev/null | xz -6 -T0 > "$tmp" 2>/dev/null; then
    local size; size=$(stat -c %s "$tmp")
    if [ "$size" -le "$JIT_CACHE_MAX_BYTES" ]; then
      mv "$tmp" "$OUT/$(basename "$JIT_CACHE_ARCHIVE")"
      echo "Triton cache packed: $size bytes" | tee -a "$LOGS/install.log"
    else
      rm -f "$tmp"
      echo "Triton cache not packed: $size bytes is over $JIT_CACHE_MAX_BYTES" | tee -a "$LOGS/install.log"
    fi
  else
    rm -f "$tmp"
  fi
}

# probe_call_setup DIR: the start of a probe's device call: DIR for its logs (copied to $OUT when the
# script exits, with the JIT cache saved), the GPU check (EXPECT_GPU, default any GPU) and the kit;
# writes the GPU's name and memory to $OUT/gpu.csv. Returns 3 for another GPU, 1 if the kit failed.
probe_call_setup() {
  LOGS=$1
  rm -rf "$LOGS" && mkdir -p "$OUT" "$LOGS"
  trap 'cp "$LOGS"/*.log "$OUT/" 2>/dev/null; jit_cache_save 2>/dev/null' EXIT
  EXPECT_GPU=${EXPECT_GPU-} expect_gpu || return 3
  kit_setup || return 1
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.csv"
}
