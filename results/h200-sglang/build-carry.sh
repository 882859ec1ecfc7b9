#!/usr/bin/env bash
# Rebuild, on a new checkout (CPU machine, package index reachable), the ignored folders that the
# device calls carry:
#   .sglkit/  the SGLang 0.5.17 kit without archives/hf.tar.xz, its Ray repacked with xz -9e (25.4 to 19.0 MB)
#   .whl/pylibs.tar.xz  optuna, alembic, Mako, colorlog and SQLAlchemy for the H200's Python 3.12,
#             unpacked as `pip install --target` would, test suites removed, C extensions stripped
# Usage, from the repository root: bash results/h200-sglang/build-carry.sh [KIT_DIR]
# (KIT_DIR defaults to ../shared/sglang-h200-kit). Each part is skipped when it is already there.
# The Ray repack takes about 10 minutes on 2 cores; SKIP_RAY=1 leaves it for later (a kernel call carries no Ray).
set -euo pipefail
kit=${1:-../shared/sglang-h200-kit}
[ -f "$kit/install.sh" ] || { echo "no kit at $kit (expected $kit/install.sh)" >&2; exit 2; }
for ignored in /.sglkit/ /.whl/ /.jitcache/; do
  git check-ignore -q "${ignored#/}x" 2>/dev/null || grep -qx "$ignored" .git/info/exclude || echo "$ignored" >> .git/info/exclude
done

if [ ! -f .sglkit/install.sh ]; then
  mkdir -p .sglkit
  (cd "$kit" && tar -cf - --exclude archives/hf.tar.xz .) | tar -xf - -C .sglkit
  chmod -R u+w .sglkit
  echo "kit copied: $(du -sh .sglkit | cut -f1)"
fi
ray=.sglkit/ray/ray-2.60.0-slim.tar.xz
if [ -z "${SKIP_RAY:-}" ] && [ ! -f .sglkit/ray/.repacked ]; then
  echo "repacking Ray with xz -9e (about 10 minutes on 2 cores)"
  xz -dc "$ray" | xz -9e -T0 > "$ray.tmp"
  mv "$ray.tmp" "$ray" && touch .sglkit/ray/.repacked
  echo "Ray repacked: $(stat -c %s "$ray") bytes"
fi

if [ ! -f .whl/pylibs.tar.xz ]; then
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" \
    optuna==5.0.0 alembic==1.20.1 Mako==1.4.3 colorlog==6.12.0 SQLAlchemy==2.0.44
  mkdir -p "$work/site"
  for wheel in "$work"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
  # what no import of tuner's reaches: test suites and packaging records
  rm -rf "$work"/site/*/tests "$work"/site/sqlalchemy/testing "$work"/site/alembic/testing "$work"/site/optuna/testing
  find "$work/site" -name '*.so' -exec strip --strip-unneeded {} +
  # the site must import here too (this Python skips the cp312 C extensions and falls back); optuna
  # also needs tqdm, which the H200 machine has through SGLang: here it comes from the project's venv
  python3 -c "import tqdm" 2>/dev/null || { echo "the import check needs tqdm: activate the project's venv first" >&2; exit 2; }
  PYTHONPATH="$work/site" python3 -c "import optuna, alembic, sqlalchemy, colorlog, mako; \
optuna.create_study(storage='sqlite:///$work/check.db').optimize(lambda t: t.suggest_float('x', 0, 1), n_trials=1)"
  mkdir -p .whl
  tar -cf - -C "$work/site" . | xz -9e > .whl/pylibs.tar.xz
  echo "libraries packed: $(stat -c %s .whl/pylibs.tar.xz) bytes"
fi
mkdir -p .jitcache
echo "carry ready: $(du -sh .sglkit .whl | tr '\n' ' ')"
