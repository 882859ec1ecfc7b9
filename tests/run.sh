#!/usr/bin/env bash
# Install tuner with its test dependencies and run the test suite (everything except GPU tests).
# Usage: bash tests/run.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install -q --disable-pip-version-check -e '.[test]'

exec python -m pytest -m "not gpu" -q "$@"
