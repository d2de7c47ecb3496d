# Set-up happens on first use: a project virtualenv with the pip extras each target needs,
# and the npm lock for the Kaitai compiler. Later runs only re-install when the inputs change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
OUT    ?= generated
PYTEST_ARGS ?=
# make test's pytest-xdist workers. Each file runs whole in one worker (its module fixtures);
# each worker starts one PostgreSQL server per major and one Spark session, on first use
# (tests/fix_pg.py, tests/fix_spark.py)
TEST_JOBS ?= 2
SPEEDUPS := $(VENV)/.speedups

.PHONY: help generate check lint test test-fast wheel bench captures clean-venv spark-cds

help:
	@echo "make generate   render generated/ from every spec under spec/ (installs .venv on first use)"
	@echo "make check      exit 0 when generated/ is up to date, 1 on drift (prints the diff), 2 on a spec error"
	@echo "make lint       ruff format --check and ruff check on the hand-written code"
	@echo "make test       lint, then the whole test suite in TEST_JOBS=2 workers (what CI runs; installs extras and npm on first use)"
	@echo "make test-fast  the codec, spec and generator tests in seconds: no Java, PostgreSQL or npm"
	@echo "make wheel      build the wheel and the sdist into dist/"
	@echo "make bench      codec, values, events, capture and Spark benchmarks against their peers"
	@echo "make captures   re-capture tests/captures/ from real PostgreSQL 15-18 servers"
	@echo "make spark-cds  build the Spark driver's class-data-sharing archive when there is none"
	@echo "make clean-venv remove .venv and node_modules"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# One stamp per set of extras, redone when pyproject.toml or setup.py changes. The editable
# install also compiles the optional C accelerator from the generated C source.
# A new generated package (a new spec) needs the editable install to map it too: the
# manifests change only when the set of generated files does.
GENERATED_PKGS := $(wildcard $(OUT)/.codegen/*.files)

$(VENV)/.codegen: pyproject.toml setup.py $(GENERATED_PKGS) | $(PY)
	$(PY) -m pip install -q -e '.[codegen]'
	touch $@ $(SPEEDUPS)

$(VENV)/.all: pyproject.toml setup.py $(GENERATED_PKGS) | $(PY)
	$(PY) -m pip install -q -e '.[all]'
	touch $@ $(VENV)/.codegen $(VENV)/.fast $(SPEEDUPS)

# The fast tier's extras only: no pyspark (Java), no PostgreSQL server wheels, no npm.
$(VENV)/.fast: pyproject.toml setup.py $(GENERATED_PKGS) | $(PY)
	$(PY) -m pip install -q -e '.[codegen,fasttest,postgres]'
	touch $@ $(VENV)/.codegen $(SPEEDUPS)

# Recompile the accelerator in place when its generated source changed (a stale build is
# ignored by the package anyway, which then runs in pure Python).
$(SPEEDUPS): $(wildcard $(OUT)/*/_speedups.c) pgcdc/runtime/speedups.h pgcdc/runtime/_capturescan.c pgcdc/runtime/_copyread.c setup.py | $(VENV)/.codegen
	$(PY) setup.py -q build_ext --inplace
	touch $@

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

generate: $(VENV)/.codegen
	$(PY) -m codegen generate --out $(OUT)
	@$(MAKE) --no-print-directory $(SPEEDUPS)

check: $(VENV)/.codegen
	$(PY) -m codegen check --out $(OUT)

# Hand-written code only: generated/ is formatted by the generator itself.
lint: $(VENV)/.codegen
	$(VENV)/bin/ruff format --check --exclude $(OUT) --exclude node_modules .
	$(VENV)/bin/ruff check --exclude $(OUT) --exclude node_modules .

# The driver JVM's class-data-sharing archive (pgcdc.runtime.spark.build_cds), built once into the
# user's cache (about 40 s): every Spark session then starts in about half the time
spark-cds: $(VENV)/.all
	$(PY) -m pgcdc.runtime.spark.build_cds >/dev/null

test: $(VENV)/.all $(SPEEDUPS) node_modules/.package-lock.json lint spark-cds
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

test-fast: $(VENV)/.fast $(SPEEDUPS)
	PGCDC_TEST_TIER=fast $(PY) -m pytest -n $(TEST_JOBS) -m "fast and not slow" -p no:cacheprovider $$($(PY) -m tests.tiers) $(PYTEST_ARGS)

wheel: $(VENV)/.all
	$(PY) -m build --no-isolation --outdir dist .

bench: $(VENV)/.all $(SPEEDUPS) node_modules/.package-lock.json spark-cds
	$(PY) -m bench

captures: $(VENV)/.all
	$(PY) -m tests.postgres.make_captures

clean-venv:
	rm -rf $(VENV) node_modules
