#!/usr/bin/env bash
# Sourced by the device scripts (run from the repository root): install SGLang 0.5.17 from the kit
# (.sglkit/, without archives/hf.tar.xz) into /tmp/site, and with KIT_RAY=1 also Ray and the study's
# Python libraries (.whl/pylibs.tar.xz, or the wheels in .whl/), then export PYTHONPATH and PATH.
# A warm machine keeps /tmp/site between calls: a marker skips the unpacking then.
# Writes its log to $LOGS/install.log; returns non-zero when anything failed.
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
  echo "installed in $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/install.log"
  export PYTHONPATH="/tmp/site:$PWD" PATH="/usr/local/cuda/bin:/tmp/site/bin:$PATH" PYTHONUNBUFFERED=1
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
}
