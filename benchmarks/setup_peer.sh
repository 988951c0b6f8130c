#!/usr/bin/env bash
# The optional peer of benchmark item 7: transformer-lens, in its own virtual environment
# .venv-bench (git-ignored), so that it never becomes a runtime dependency of headscope and its
# own dependencies (wandb, datasets, protobuf, ...) stay out of .venv.
#  - .venv-bench sees .venv's packages (torch, transformers, headscope) through a .pth file rather
#    than installing a second torch (an unpinned one would be a multi-GB CUDA build).
#  - Every package of .venv is pinned as a constraint, so pip cannot upgrade or remove anything
#    there: it only adds what transformer-lens needs, into .venv-bench.
# Safe to re-run. Then `make bench` finds it by itself (or pass --peer-python .venv-bench/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "setup_peer: no .venv; run 'make setup' first" >&2; exit 2; }
BASE=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ -x .venv-bench/bin/python ] || "$BASE" -m venv .venv-bench
BENCH_SITE=$(.venv-bench/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$SITE')" > "$BENCH_SITE/zz-headscope-venv.pth"
PINS=$(mktemp)
trap 'rm -f "$PINS"' EXIT
.venv/bin/python -m pip --disable-pip-version-check list --format=freeze --exclude-editable > "$PINS"
.venv-bench/bin/python -m pip --disable-pip-version-check -q install -c "$PINS" "transformer-lens==4.3.0" "pyinstrument>=4.6"
.venv-bench/bin/python -c "import transformer_lens, probe; print('setup_peer: transformer-lens ready in .venv-bench')"
