# dlsub: make testbed [SLURM=V] | make demo | make test | make lint | make bench | make bench-policies
# testbed, demo and test need root: they install packages and start Slurm.
SHELL := /bin/bash
PREFIX ?= /opt/dlsub
VENV := $(PREFIX)/venv
TEST_USER ?= dltest
# Which Slurm the testbed runs: 22.05 (this machine's Debian 12), 24.11 (Debian 13's
# packages) or 26.05 (Debian unstable's); `make testbed SLURM=24.11`, `make test SLURM=26.05`.
SLURM ?= 22.05
export DLSUB_SLURM := $(SLURM)

.PHONY: testbed testbed-down install demo test lint lint-installed unit integration bench bench-policies

testbed:
	bash testbed/up.sh

testbed-down:
	bash testbed/down.sh

install:
	bash testbed/install-dlsub.sh

demo: testbed
	bash examples/demo.sh

test: testbed
	$(MAKE) --no-print-directory lint-installed
	$(VENV)/bin/pytest -p no:cacheprovider -v tests

# ruff over the checkout; mypy over the installed package (from outside the
# checkout, so it sees what users import: the one `dlsub` namespace, py.typed);
# shellcheck over every shell script in the repository. Nothing is written
# into the checkout (no caches).
SHELL_SCRIPTS = $(shell git ls-files --cached --others --exclude-standard -- '*.sh' '*.bash' .ci/run 2>/dev/null || find . -name '*.sh' -not -path './build/*')
lint: install
	$(MAKE) --no-print-directory lint-installed

lint-installed:
	@test -x $(VENV)/bin/mypy || { echo "make lint: no $(VENV)/bin/mypy: run make install (or make testbed) first" >&2; exit 2; }
	$(VENV)/bin/ruff check --no-cache .
	cd / && $(VENV)/bin/mypy --config-file "$(CURDIR)/pyproject.toml" --cache-dir /dev/null -p dlsub
	shellcheck -x -P SCRIPTDIR $(SHELL_SCRIPTS)

unit: install
	$(VENV)/bin/pytest -p no:cacheprovider -v tests/unit

integration: testbed
	$(VENV)/bin/pytest -p no:cacheprovider -v tests/integration

bench: testbed
	$(VENV)/bin/python benchmarks/container_overhead.py
	$(VENV)/bin/python benchmarks/immediate_vs_ideal.py
	$(VENV)/bin/python benchmarks/elastic_vs_rigid.py
	$(VENV)/bin/python benchmarks/resize_latency.py

# Policies and simulator: no testbed needed, only the virtualenv.
bench-policies: install
	$(VENV)/bin/python benchmarks/policy_speed.py
	$(VENV)/bin/python benchmarks/pollux_fidelity.py
