# dlsub: make testbed | make demo | make test | make bench | make bench-policies
# testbed, demo and test need root: they install packages and start Slurm.
SHELL := /bin/bash
PREFIX ?= /opt/dlsub
VENV := $(PREFIX)/venv
TEST_USER ?= dltest

.PHONY: testbed testbed-down install demo test unit integration bench bench-policies

testbed:
	bash testbed/up.sh

testbed-down:
	bash testbed/down.sh

install:
	bash testbed/install-dlsub.sh

demo: testbed
	bash examples/demo.sh

test: testbed
	$(VENV)/bin/pytest -p no:cacheprovider -v tests

unit: install
	$(VENV)/bin/pytest -p no:cacheprovider -v tests/unit

integration: testbed
	$(VENV)/bin/pytest -p no:cacheprovider -v tests/integration

bench: testbed
	$(VENV)/bin/python benchmarks/container_overhead.py
	$(VENV)/bin/python benchmarks/immediate_vs_ideal.py

# Policies and simulator: no testbed needed, only the virtualenv.
bench-policies: install
	$(VENV)/bin/python benchmarks/policy_speed.py
	$(VENV)/bin/python benchmarks/pollux_fidelity.py
