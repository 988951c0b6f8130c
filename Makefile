# The README's two commands: `make report` (set up, then the main job on the default model) and
# `make test`. Both set up .venv first; setup is skipped when nothing it depends on changed.
PY := .venv/bin/python
OUT ?= headscope-report
MODEL ?= minilm

.PHONY: setup report test test-docs browser bench bench-gpu docs
setup: .venv/.setup-done
.venv/.setup-done: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

report: setup
	.venv/bin/headscope run --model $(MODEL) --report $(OUT) --force

# Debian's Chromium for the report's browser tests (best effort: the tests skip, saying why, without it).
browser:
	@command -v chromium >/dev/null || [ "$$(id -u)" != 0 ] || (apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y chromium >/dev/null) || echo "make: could not install chromium; browser tests will be skipped" >&2

test: setup browser
	$(PY) -m pytest -q

# The doc pages marked `<!-- doc-tests: slow -->` (real weights, minutes): every block of them, in page order.
# `make test` runs the other pages' blocks; CI runs both.
test-docs: setup
	$(PY) -m pytest -q --docs-slow -m docs_slow README.md docs

# Item 7's peer (TransformerLens) lives in its own .venv-bench; without it that item is skipped.
bench: setup
	-bash benchmarks/setup_peer.sh
	$(PY) benchmarks/run.py $(BENCH_ARGS)

# The GPU figures (issue 26), on a machine with a CUDA GPU: one results file, .bench/gpu/results.json (+ .md).
bench-gpu: setup
	PYTHON=$(PY) bash benchmarks/gpu.sh

# The documentation site (mkdocs.yml) into .site/; --strict: a broken link or API reference fails.
docs: setup
	$(PY) -m mkdocs build --strict
