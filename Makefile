# capsule-run: `make run` sets everything up and runs an example; `make test` sets everything
# up and runs the whole suite (as root: then again as an unprivileged user, the rootless suite).

PYTHON ?= /usr/bin/python3
VENV   ?= .venv
BIN     = $(VENV)/bin
# Debian packages: libcap-dev to build python-prctl, libseccomp2 for pyseccomp, python3-venv
# and -dev for the venv, gcc for the C probes in the seccomp tests, procps for ps, and the
# interpreter's numpy/pandas/matplotlib under /usr, which every sandbox sees.
APT_PACKAGES = libcap-dev libseccomp2 python3-venv python3-dev gcc make procps iproute2 \
               python3-numpy python3-pandas python3-matplotlib

.PHONY: install deps venv run test test-root test-rootless lint bench soak clean

install: deps venv

deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages (install as root): $$missing" >&2; exit 1; fi; \
	  echo "installing: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(BIN)/capsule-run

$(BIN)/capsule-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

run: install
	$(BIN)/capsule-run --pretty --profile python < examples/plot.json

test: install
	scripts/test.sh

lint: install
	$(BIN)/ruff check capsule tests scripts
	$(BIN)/mypy capsule

bench: install
	$(BIN)/python scripts/bench.py

soak: install
	$(BIN)/python scripts/soak.py --runs 500 --parallel 8

clean:
	rm -rf $(VENV) *.egg-info build
