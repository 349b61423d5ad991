# Both main targets create and reuse a local virtual environment by themselves.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test check docs bench proto proto-release test-model clean clean-runs

# setup.py and every C source (the optional extensions): rebuilt by the editable install when one changes.
# One venv for both: `make demo` installs only what the demo needs ('.[demo]'); `make test`/`make check`
# upgrade the same venv to '.[dev]' (a superset, so it marks the demo's stamp done too).
DEMO_STAMP := $(VENV)/.demo-stamp
INSTALL_DEPS := pyproject.toml setup.py $(wildcard */*.c)

$(DEMO_STAMP): $(INSTALL_DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

$(STAMP): $(INSTALL_DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/lib/python*/site-packages/dualloop-namespace-view.pth  # an older venv's: the view is for tools only
	$(PY) scripts/namespace_view.py --pth > /dev/null
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/dualloop demo

# The Node client's dependencies (tests/clients runs it against a live server), reinstalled when the
# lock file is newer; without npm the Node tests skip (unless DUALLOOP_REQUIRE_NODE=1, as in CI).
# buf (tools/buf) checks the proto the same way (tests/proto/test_buf.py).
NODE_DEPS := $(if $(shell command -v npm),clients/node/node_modules/.package-lock.json tools/buf/node_modules/.package-lock.json)

%/node_modules/.package-lock.json: %/package-lock.json
	npm ci --prefix $* --no-audit --no-fund --loglevel=error
	touch $@

# the checks first (seconds), then the suite; the 15 slowest tests close the report
test: check $(NODE_DEPS)
	$(PY) -m pytest -q --durations=15

# lint, format, sizes, types, layers and the generated docs. mypy and import-linter walk folders, so they read
# the namespace view of scripts/namespace_view.py (mypy through its mypy_path, import-linter through PYTHONPATH)
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/size_check.py
	$(PY) scripts/namespace_view.py > /dev/null
	$(VENV)/bin/mypy -p dualloop
	PYTHONPATH=build/namespace $(VENV)/bin/lint-imports
	$(PY) scripts/module_inventory.py --check

# the module inventory of docs/architecture.md, from the modules' docstrings
docs:
	$(PYTHON) scripts/module_inventory.py

bench: $(STAMP)
	$(VENV)/bin/dualloop bench tick --sessions 8 --duration 60

proto: $(STAMP)
	$(PY) scripts/gen_proto.py

# at a release: the image later changes are checked against (buf breaking must stay additive)
proto-release: tools/buf/node_modules/.package-lock.json
	tools/buf/node_modules/.bin/buf build proto --exclude-source-info -o proto/released/dualloop.binpb

test-model: $(STAMP)
	$(VENV)/bin/dualloop make-test-model

# everything make, the install and the tests made: the venv, build/ (the namespace view, setuptools'
# build), the extensions the editable install compiled beside their C sources, npm's node_modules and
# the tools' caches. Not runs/: a user's reports and recordings are theirs to drop (make clean-runs).
clean:
	rm -rf $(VENV) build .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info $(wildcard */*.so) \
		clients/node/node_modules tools/buf/node_modules
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# every demo's report and every recording under runs/
clean-runs:
	rm -rf runs
	@echo "removed runs/ (the demos' reports and the recordings)"
