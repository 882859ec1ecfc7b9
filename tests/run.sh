#!/usr/bin/env bash
# Install tuner with its test dependencies and run the test suite (everything except GPU tests).
# Usage: bash tests/run.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

pip_install() { python -m pip install -q --disable-pip-version-check "$@"; }

# System packages the tests drive for real: Chromium (dashboard tests in a real browser).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    if ! command -v chromium >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    fi
else
    echo "tests/run.sh: not root or no apt-get; browser tests skip unless chromium is installed" >&2
fi

# A CPU build of torch for the `transformers serve` backend tests (a real engine on the CPU).
python -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
pip_install -e '.[test,transformers]'

exec python -m pytest -m "not gpu" -q "$@"
