# cbasr: `make demo` runs the synthetic recipe end to end; `make test` runs the test suite.
# Both create the project virtual environment (.venv) with pinned dependencies when missing.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
, := ,

.PHONY: help install demo test test-slow mutate docs lint format clean-demo

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

install: $(STAMP)  ## create .venv and install cbasr with pinned dependencies

# uv unpacks the wheels in parallel and keeps them in its cache: a fresh .venv takes about 15 s
# with a warm cache against 2 min 20 s with pip on the 2-core machine. Where uv cannot be had or
# cannot reach the index (uv reads UV_INDEX_URL, not pip's configuration), the same pinned set is
# installed by pip. `make install INSTALLER=pip` skips uv. Then scripts/precompile.py imports
# what the commands import, writing its bytecode even where PYTHONDONTWRITEBYTECODE is set: 14 s,
# against 25 s for byte-compiling all 10,000 files of the environment (uv's --compile-bytecode;
# pip byte-compiles everything itself), and compiles the CPU kernels that numba caches on disk
# (about 20 s more, once, where each process that first calls one would compile it). It only
# saves start-up time: where it fails, the install stands and the commands compile what they
# import as they start.
INSTALLER ?= uv
UV_VERSION := 0.13.9

# $(call pinned_install,EXTRAS): cbasr (editable) with EXTRAS, pinned by requirements.lock
define pinned_install
if [ "$(INSTALLER)" = uv ] \
  && $(BIN)/python -m pip install --quiet 'uv==$(UV_VERSION)' \
  && $(BIN)/uv pip install --quiet --python $(BIN)/python -c requirements.lock -e '.[$(1)]'; \
then :; \
else \
  echo "installing with pip (INSTALLER=$(INSTALLER))"; \
  $(BIN)/python -m pip install --quiet --upgrade pip \
  && $(BIN)/python -m pip install --quiet -c requirements.lock -e '.[$(1)]'; \
fi
endef

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(call pinned_install,test)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python scripts/precompile.py \
	  || echo "scripts/precompile.py failed: the commands will start slower"
	touch $@

demo: $(STAMP)  ## synthetic corpus -> features -> BLSTM-HAT -> decode -> PER table (recipes/synth)
	PATH="$(CURDIR)/$(BIN):$$PATH" recipes/synth/run.sh --config demo_hat

# The tests run on every core (pytest-xdist's -n auto, one torch thread per worker); a file's
# tests stay on one worker (--dist loadfile), so what a module's fixture builds is built once.
PYTEST := $(BIN)/python -m pytest -q -n auto --dist loadfile

test: $(STAMP)  ## the fast test suite: a representative of every behaviour (under 5 min on 2 cores)
	$(PYTEST) -m "not slow and not gpu"

test-slow: $(STAMP)  ## every test but the GPU's: the fast ones, the sweeps and whole recipes
	$(PYTEST) -m "not gpu"

# make mutate PATHS="cbasr/inference/grid.py cbasr/corpora/download.py" [SINCE=af4440f]
#   [SAMPLE=16] [SEED=1]: one-line mutants of PATHS against their folders' fast tests; it lists
# the survivors (scripts/mutate.py says how mutants are made and judged)
mutate: $(STAMP)  ## one-line mutants of PATHS run against their folders' tests; lists survivors
	@test -n "$(PATHS)" || { echo "usage: make mutate PATHS=cbasr/inference/grid.py [SINCE=rev] [SAMPLE=n] [SEED=s]"; exit 2; }
	$(BIN)/python scripts/mutate.py $(PATHS) $(if $(SINCE),--since $(SINCE)) \
	  $(if $(SAMPLE),--sample $(SAMPLE)) $(if $(SEED),--seed $(SEED))

# make docs: the site of docs/ (MyST Markdown, Sphinx) into docs/_build/html, warnings as errors;
# it runs the tutorial (docs/tutorial.md: a small synth corpus, two models trained on one CPU
# thread) and generates its tables from the code, recipes/*/results.csv and benchmarks/. The
# first run installs the `docs` extra into .venv, pinned by requirements.lock, as `make install`
# installs the test one (uv, else pip). `rm -rf docs/_build` for a build from scratch.
$(DOCS_STAMP): $(STAMP)
	$(call pinned_install,test$(,)docs)
	touch $@

docs: $(DOCS_STAMP)  ## the documentation site into docs/_build/html (runs its tutorial: about 2 min)
	OMP_NUM_THREADS=1 $(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

lint: $(STAMP)  ## ruff: the formatter's check and the linter (pyproject.toml's [tool.ruff])
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

format: $(STAMP)  ## ruff: format the code and apply the linter's safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-demo:  ## delete the demo's data, experiments and logs
	rm -rf recipes/synth/data recipes/synth/exp recipes/synth/log
