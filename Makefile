# Set-up happens on first use: a project virtualenv with the pip extras each target needs,
# and the npm lock for the Kaitai compiler. Later runs only re-install when the inputs change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
SPEC   ?= spec/pgoutput.yaml
OUT    ?= generated
PYTEST_ARGS ?=
SPEEDUPS := $(VENV)/.speedups

.PHONY: generate check test bench captures clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# One stamp per set of extras, redone when pyproject.toml or setup.py changes. The editable
# install also compiles the optional C accelerator from the generated C source.
$(VENV)/.codegen: pyproject.toml setup.py | $(PY)
	$(PY) -m pip install -q -e '.[codegen]'
	touch $@ $(SPEEDUPS)

$(VENV)/.all: pyproject.toml setup.py | $(PY)
	$(PY) -m pip install -q -e '.[all]'
	touch $@ $(VENV)/.codegen $(SPEEDUPS)

# Recompile the accelerator in place when its generated source changed (a stale build is
# ignored by the package anyway, which then runs in pure Python).
$(SPEEDUPS): generated/pgoutput_codec/_speedups.c setup.py | $(VENV)/.codegen
	$(PY) setup.py -q build_ext --inplace
	touch $@

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

generate: $(VENV)/.codegen
	$(PY) -m codegen generate --spec $(SPEC) --out $(OUT)
	@$(MAKE) --no-print-directory $(SPEEDUPS)

check: $(VENV)/.codegen
	$(PY) -m codegen check --spec $(SPEC) --out $(OUT)

test: $(VENV)/.all $(SPEEDUPS) node_modules/.package-lock.json
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.all $(SPEEDUPS) node_modules/.package-lock.json
	$(PY) -m bench

captures: $(VENV)/.all
	$(PY) -m tests.postgres.make_captures

clean-venv:
	rm -rf $(VENV) node_modules
