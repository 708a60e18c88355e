# `make test` and `make demo` each build .venv from nothing (torch pinned: an unpinned torch would
# pull a multi-GB CUDA build) and then run. The stamp file re-installs when the inputs change.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
REQS := pyproject.toml $(wildcard requirements/nodeps-*.txt) $(wildcard native/src/qlinear_native/*)
# GPTQModel 7.7.0, the reference, in a virtualenv of its own (tests/external cross-check against it).
REF := .venv-ref
REF_STAMP := $(REF)/.installed-stamp

.PHONY: test test-fast demo lint docs clean

$(STAMP): $(REQS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,demo]'
	for f in requirements/nodeps-*.txt; do $(BIN)/python -m pip install -q --no-deps -r $$f || exit 1; done
	# Optional: ggml itself for GGUFCppKernel (builds from source with cmake in about a minute). A failed
	# build only makes its tests skip, with the install command in the reason.
	$(BIN)/python -m pip install -q --no-deps ggml-python==0.0.45 || echo "warning: ggml-python did not build"
	# Optional: qlinear's own native CPU int4 kernels (AVX512-BF16 / AMX, a few seconds with a C compiler);
	# without them the torch paths run and their tests skip.
	$(BIN)/python -m pip install -q ./native || echo "warning: qlinear-native did not build (no C compiler?)"
	touch $(STAMP)

$(REF_STAMP): requirements/gptqmodel-crosscheck.txt
	test -x $(REF)/bin/python || $(PY) -m venv $(REF)
	$(REF)/bin/python -m pip install -q torch==2.13.0 numpy==2.4.6
	$(REF)/bin/python -m pip install -q --no-deps -r requirements/gptqmodel-crosscheck.txt
	touch $(REF_STAMP)

test: $(STAMP) $(REF_STAMP)
	$(BIN)/ruff check src tests benchmarks native
	$(BIN)/python -m pytest -q --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not external"

demo: $(STAMP)
	$(BIN)/python -m qlinear.demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks native

docs: $(STAMP)
	{ printf '# Backends\n\n'; cat docs/backends.intro; echo; $(BIN)/python -m qlinear.cli backends --markdown; } > docs/backends.md

clean:
	rm -rf $(VENV) $(REF) .pytest_cache .ruff_cache .hypothesis
