# heapwatch: every target creates what it needs (virtual environment, the C
# extension) on a fresh machine.  `make help` lists them.

PYTHON      ?= python3
VENV        ?= .venv
VPY         := $(VENV)/bin/python
VERSIONS    ?= 3.9 3.10 3.11 3.12 3.13 3.14 3.15
# Versions whose Debian builds need a newer C library than the host's: they
# run in a Debian sid chroot (tools/sid-python creates it once, cached).
SID_VERSIONS := 3.14 3.15
PYTEST_ARGS ?=
SOURCES     := $(shell find agent exporters -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.pyi' -o -name '*.pth' 2>/dev/null) setup.py pyproject.toml \
               $(shell find agent/heapwatch/server/static -type f 2>/dev/null)
ASAN_LIB     = $(shell gcc -print-file-name=libasan.so)
UBSAN_LIB    = $(shell gcc -print-file-name=libubsan.so)
SANITIZED    = PYTHONMALLOC=malloc LD_PRELOAD="$(ASAN_LIB) $(UBSAN_LIB)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 HEAPWATCH_SANITIZED=1
SOAK_SECONDS ?= 300

.DEFAULT_GOAL := help
.PHONY: wheels wheel-host wheel-test wheel-test-host demo-image bench-black-box bench-profiles bench-leaks ci-lane-host ci-lane-sid guest-newest help demo test test-all sanitize bench lint ci ci-tools install clean dashboard guest soak soak-short soak-sanitize

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(VENV)/.deps: requirements-dev.txt requirements-deploy.txt
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q -U pip
	$(VPY) -m pip install -q -r requirements-dev.txt
	$(VPY) -m pip install -q -r requirements-deploy.txt || echo "grafana-foundation-sdk unavailable: dashboard generation skipped"
	touch $@

$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(VPY) -m pip install -q --no-build-isolation --force-reinstall --no-deps .
	touch $@

install: $(VENV)/.installed  ## build the C extension and install heapwatch into .venv

demo: $(VENV)/.installed  ## run the demo service with the agent on (Ctrl-C to stop)
	HEAPWATCH_ENABLED=1 HEAPWATCH_INTERVAL=$${HEAPWATCH_INTERVAL:-5} HEAPWATCH_SAMPLE_INTERVAL=$${HEAPWATCH_SAMPLE_INTERVAL:-64KiB} $(VPY) examples/demo_service.py

test: $(VENV)/.installed  ## run the test suite with python3
	cd tests && $(abspath $(VPY)) -m pytest -p no:cacheprovider $(PYTEST_ARGS)

test-all:  ## run the test suite on every supported Python (3.9 to 3.15)
	@set -e; for v in $(VERSIONS); do \
	  case " $(SID_VERSIONS) " in \
	    *" $$v "*) echo "=== Python $$v (Debian sid chroot)"; \
	      tools/sid-python run make --no-print-directory test PYTHON=python$$v VENV=.venvs/$$v \
	        PYTEST_ARGS='$(PYTEST_ARGS)' ;; \
	    *) py=$$(tools/find-python $$v); \
	      echo "=== Python $$v ($$py)"; \
	      $(MAKE) --no-print-directory test PYTHON=$$py VENV=.venvs/$$v ;; \
	  esac; \
	done

# Wheels: tools/build-wheels builds them (from the sdist, against Debian 11's
# C library), tools/test-wheel installs one into a fresh venv without a
# compiler and runs INSTALLED_TESTS (relative to tests/) against it.  The cp39
# wheel is tested in Debian 11 itself, with its python3.9.
WHEEL_TOOLS     := .venvs/wheel-tools
PACKAGE_VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' agent/heapwatch/_version.py)
BULLSEYE_VERSIONS := 3.9
INSTALLED_TESTS := integration/test_installed_package.py integration/test_autostart_isolated.py \
  integration/test_agent_end_to_end.py integration/test_dumps_installed.py \
  unit/test_tracemalloc_api.py integration/test_tracemalloc_tracing.py

$(WHEEL_TOOLS)/.deps: requirements-wheels.txt
	$(PYTHON) -m venv $(WHEEL_TOOLS)
	$(WHEEL_TOOLS)/bin/python -m pip install -q -r requirements-wheels.txt
	touch $@

wheels: $(WHEEL_TOOLS)/.deps  ## the sdist and a manylinux wheel for each CPython (3.9 to 3.15) into dist/
	SID_VERSIONS="$(SID_VERSIONS)" tools/build-wheels $(WHEEL_TOOLS) $(VERSIONS)

wheel-host: $(WHEEL_TOOLS)/.deps  ## the sdist and this Python's wheel into dist/
	SID_VERSIONS="$(SID_VERSIONS)" tools/build-wheels $(WHEEL_TOOLS) $(HOST_VERSION)

wheel-test:  ## install each wheel of dist/ as a user would (no compiler) and test the installed package
	@set -e; for v in $(VERSIONS); do \
	  wheel=$$(echo dist/heapwatch-$(PACKAGE_VERSION)-cp$$(echo $$v | tr -d .)-*.whl); \
	  case " $(SID_VERSIONS) " in *" $$v "*) \
	    echo "=== $$wheel (Debian sid chroot)"; \
	    tools/sid-python run tools/test-wheel python$$v $$wheel $(INSTALLED_TESTS); continue ;; esac; \
	  case " $(BULLSEYE_VERSIONS) " in *" $$v "*) \
	    echo "=== $$wheel (Debian 11 chroot)"; \
	    tools/bullseye-python run tools/test-wheel python$$v $$wheel $(INSTALLED_TESTS); continue ;; esac; \
	  echo "=== $$wheel"; \
	  tools/test-wheel $$(tools/find-python $$v) $$wheel $(INSTALLED_TESTS); \
	done

wheel-test-host:  ## wheel-test for this Python's wheel alone
	$(MAKE) --no-print-directory wheel-test VERSIONS=$(HOST_VERSION)

# The image's Python: the X.Y of its FROM python:X.Y-slim-bookworm.
DEMO_IMAGE_VERSION := $(shell sed -n 's/^FROM python:\([0-9.]*\)-slim.*/\1/p' deploy/compose/demo.Dockerfile)

demo-image:  ## deploy/compose/demo.Dockerfile's steps in a Debian 12 slim chroot (no container runtime here)
	$(MAKE) --no-print-directory wheels VERSIONS=$(DEMO_IMAGE_VERSION)
	tools/dockerfile-in-chroot deploy/compose/demo.Dockerfile

sanitize:  ## build the core with ASan+UBSan and run the core tests under them
	$(MAKE) --no-print-directory $(VENV)-asan/.deps VENV=$(VENV)-asan
	HEAPWATCH_SANITIZE=1 $(VENV)-asan/bin/python -m pip install -q --no-build-isolation --force-reinstall --no-deps .
	cd tests && $(SANITIZED) \
	  $(abspath $(VENV)-asan)/bin/python -m pytest -p no:cacheprovider -x core $(PYTEST_ARGS)

dashboard: $(VENV)/.installed  ## regenerate deploy/grafana/dashboard.json from deploy/grafana/generate.py
	$(VPY) deploy/grafana/generate.py

bench: $(VENV)/.installed  ## measure slowdown and memory against untraced and the stdlib tracer
	$(VPY) benchmarks/run.py $(BENCH_ARGS)

bench-leaks: $(VENV)/.installed  ## the leak score's scenario bank: time to flag each leak, highest score of each non-leak
	$(VPY) benchmarks/leaks.py $(BENCH_ARGS)

bench-profiles: $(VENV)/.installed  ## a profile push per cycle (encode, POST to a loopback receiver) at 10k and 100k sites
	$(VPY) benchmarks/profile_push.py $(BENCH_ARGS)

bench-black-box: $(VENV)/.installed  ## the black box: crossing to finished dump and its memory at 10k to 1M traces, the idle poll
	$(VPY) benchmarks/black_box.py $(BENCH_ARGS)

guest: $(VENV)/.installed  ## CPython's own test files untraced and under the agent (exact, sample): no failure added
	$(VPY) tests/guest/run.py --python $(abspath $(VPY)) --markdown $(VENV)/guest.md $(GUEST_ARGS)

soak: $(VENV)/.installed  ## the agent in a busy service for SOAK_SECONDS (300): no crash, hang, growth or noise
	$(VPY) tests/soak/soak.py --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

soak-short: $(VENV)/.installed  ## the soak run for 60 s
	$(VPY) tests/soak/soak.py --seconds 60 $(SOAK_ARGS)

soak-sanitize:  ## the soak run for 180 s with the core under ASan+UBSan (the sanitize build; 3-5 times slower)
	$(MAKE) --no-print-directory $(VENV)-asan/.deps VENV=$(VENV)-asan
	HEAPWATCH_SANITIZE=1 $(VENV)-asan/bin/python -m pip install -q --no-build-isolation --force-reinstall --no-deps .
	$(SANITIZED) $(VENV)-asan/bin/python tests/soak/soak.py --seconds 180 $(SOAK_ARGS)

lint: $(VENV)/.deps  ## ruff, mypy --strict and the layer contract (tools/check_layers.py)
	$(VENV)/bin/ruff check agent exporters tests benchmarks examples deploy tools
	$(VENV)/bin/ruff format --check agent exporters tests benchmarks examples deploy tools
	$(VENV)/bin/mypy
	$(VPY) tools/check_layers.py

ci-tools:  ## install the external tools CI tests with (Debian packages)
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v go >/dev/null \
	  && command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus golang-go chromium chromium-driver; }

ci: ci-tools  ## what CI runs: lint, every Python, the sanitizer build, the guest suite, the real tools
	$(MAKE) --no-print-directory lint
	HEAPWATCH_REQUIRE_TOOLS=1 $(MAKE) --no-print-directory -j2 --output-sync=target ci-lane-host ci-lane-sid
	$(MAKE) --no-print-directory -j2 --output-sync=target guest guest-newest
	$(MAKE) --no-print-directory soak-short

# make ci runs two lanes side by side on its two cores (most of a suite's time
# is spent waiting on processes and servers), each interpreter with its own
# venv and build tree: the host's other versions in one; in the other this
# Python's whole suite, the sanitizer build and the chroot's versions.  Tests
# of the deploy/ files alone (marker deploy_files: promtool and Prometheus on
# YAML, no heapwatch code runs) do not depend on the Python version: they run
# once, in this Python's suite.
HOST_VERSION := $(shell $(PYTHON) -c 'import sys;print("%d.%d"%sys.version_info[:2])')
NEWEST       := $(lastword $(SID_VERSIONS))
ONCE_ONLY    := -m "not deploy_files"

ci-lane-host:
	$(MAKE) --no-print-directory test-all PYTEST_ARGS='$(ONCE_ONLY)' \
	  VERSIONS="$(filter-out $(HOST_VERSION) $(SID_VERSIONS),$(VERSIONS))"
	$(MAKE) --no-print-directory wheel-host
	$(MAKE) --no-print-directory wheel-test-host

ci-lane-sid:
	$(MAKE) --no-print-directory test
	$(MAKE) --no-print-directory sanitize
	$(MAKE) --no-print-directory test-all PYTEST_ARGS='$(ONCE_ONLY)' VERSIONS="$(SID_VERSIONS)"

guest-newest:  ## the guest suite on the newest Python (in the Debian sid chroot)
	tools/sid-python run make --no-print-directory guest PYTHON=python$(NEWEST) VENV=.venvs/$(NEWEST)

clean:  ## remove build products and virtual environments
	rm -rf build dist *.egg-info agent/*.egg-info $(VENV) $(VENV)-asan .venvs agent/heapwatch/*.so
