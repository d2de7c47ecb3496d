# Set-up happens on first use: a project virtualenv with the pip extras each target needs,
# and the npm lock for the Kaitai compiler. Later runs only re-install when the inputs change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
SPEC   ?= spec/pgoutput.yaml
OUT    ?= generated
PYTEST_ARGS ?=

.PHONY: generate check test bench captures clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# One stamp per set of extras, redone when pyproject.toml changes.
$(VENV)/.codegen: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[codegen]'
	touch $@

$(VENV)/.all: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[all]'
	touch $@ $(VENV)/.codegen

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

generate: $(VENV)/.codegen
	$(PY) -m codegen generate --spec $(SPEC) --out $(OUT)

check: $(VENV)/.codegen
	$(PY) -m codegen check --spec $(SPEC) --out $(OUT)

test: $(VENV)/.all node_modules/.package-lock.json
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(VENV)/.all node_modules/.package-lock.json
	$(PY) -m bench

captures: $(VENV)/.all
	$(PY) -m tests.postgres.make_captures

clean-venv:
	rm -rf $(VENV) node_modules
