# Every target bootstraps .venv from pyproject.toml first, so a fresh clone needs only `make`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-all docs fuzz model ui bench bench-quick soak lint java browser azurite clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (set PYTHON=/path/to/python3.11)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench,docs]'
	@touch $(STAMP)

java:
	@bash tools/check_java.sh

# Headless Chromium and chromedriver for the end-to-end test of the Dagster UI (Debian packages).
browser:
	@bash tools/install_browser.sh

# Azurite, the Azure Storage emulator, and the Node.js it runs on, for the tests of a lake on az://
# (npm packages, into tools/azurite/node_modules; again only when its package-lock.json changes).
azurite:
	@bash tools/install_azurite.sh

demo: java $(STAMP)
	$(BIN)/python -m poison_pipeline.demo

# `make test`, the loop before a change (about 15 minutes on 2 cores): the linter and the type checker
# (pyproject.toml: strict on domain/ and operations/), the documentation site (a broken link fails it),
# the default suite, the bounded model-based test (processes of their own: it patches delta-rs to
# count commits), then the end-to-end core (a full scenario, kills at a seeded sample of every
# campaign's commit points, lakes on S3 and Azurite, the operator's browser tour). Each pytest stage
# runs on two workers (pytest-xdist: a SparkSession, a lake root and servers of its own each) and
# stops make on a failure; each appends its result line to poison_pipeline_tests/results/test_stages.jsonl.
# `make test-all` (CI; about 25 minutes): `make test`, then what it samples or leaves out (marked
# `full`: every other kill point, the soak minute, the clusters, the sensors' tour, 50 runs in a row).
PYTEST := $(BIN)/pytest -q -p no:cacheprovider -n 2 --durations=15

test: java browser azurite $(STAMP)
	$(BIN)/ruff check poison_pipeline poison_pipeline_tests benchmarks tools
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site
	TEST_STAGE=default $(PYTEST) -m "not e2e and not model and not full"
	TEST_STAGE=model HYPOTHESIS_PROFILE=ci $(PYTEST) -m model poison_pipeline_tests/test_model.py
	TEST_STAGE=e2e-core $(PYTEST) -m "e2e and not model and not full"

test-all: test
	TEST_STAGE=full $(PYTEST) -m "full and not model"

# The fuzz tests with hypothesis's long profile (`make test` runs them bounded): at least 10,000
# generated envelopes, declarations and argument lists; the counts are printed at the end.
fuzz: java $(STAMP)
	HYPOTHESIS_PROFILE=long $(BIN)/pytest -q --durations=5 poison_pipeline_tests/test_fuzz_*.py

# The documentation site (mkdocs.yml, docs/) into site/; --strict fails on a broken link, a page left
# out of the nav or an API name that does not render.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

ui: java $(STAMP)
	DAGSTER_HOME=$(CURDIR) $(BIN)/python tools/ui.py

# Every benchmark at full size (about an hour; run it on a quiet machine): one JSON line each on
# stdout, also appended to benchmarks/results/. `bench-quick` runs them all at small sizes (CI).
bench: java $(STAMP)
	$(BIN)/python benchmarks/run_all.py

bench-quick: java $(STAMP)
	$(BIN)/python benchmarks/run_all.py --quick

# The example queues for SOAK_MINUTES under dagster dev, with traffic, an outage, kills and concurrent
# starts; then the books must balance (benchmarks/README.md, "Soak"). Not in CI: `make test` runs a
# one-minute profile of it (poison_pipeline_tests/test_soak.py).
SOAK_MINUTES ?= 30
soak: java $(STAMP)
	$(BIN)/python benchmarks/soak.py --minutes $(SOAK_MINUTES)

clean:
	rm -rf $(VENV) site lake demo_lake .dagster_home .spark_connect .mypy_cache *.egg-info tools/azurite/node_modules

# The model-based test of "nothing lost" (poison_pipeline_tests/test_model.py) with its long profile:
# 2,000 random sequences that ran all their 30 steps, in chunks, one pytest process per core (four to
# seven hours on 2 cores). Each chunk's counts go to poison_pipeline_tests/results/model_long.jsonl, so a stopped run
# resumes; the totals are printed at the end (tools/model_long.py --help).
model: $(STAMP)
	$(BIN)/python tools/model_long.py
