# NodeWright developer entry points. `make test` is what CI runs; `make demo` is the main job.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: help
help: ## list targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e . --group dev
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## create the virtualenv with runtime and dev dependencies

.PHONY: controlplane
controlplane: ## build kube-apiserver, kube-controller-manager, kubectl, etcd, kwok from Go modules (cached)
	bash hack/controlplane/build.sh

.PHONY: realnode
realnode: controlplane ## real nodes' base root: containerd 2 and CNI plugins from Go modules, Debian's runc and busybox (cached)
	bash hack/realnode/build.sh >/dev/null

.PHONY: helm
helm: ## build helm v3 from Go modules (cached in ~/.cache/nodewright/helm/); the chart tests use it
	bash hack/helm/build.sh >/dev/null

.PHONY: images
images: venv ## operator, webhook, agent images as OCI layouts in build/images/ (no container engine; checked with chroot as root)
	$(PY) hack/images/build.py --out build/images $(if $(filter 0,$(shell id -u)),--check,)

.PHONY: chart
chart: helm ## package the Helm chart into build/chart/ (push: helm push build/chart/*.tgz oci://REGISTRY/charts)
	$$(bash hack/helm/build.sh 2>/dev/null) package helm/nodewright -d build/chart

.PHONY: generate
generate: venv ## regenerate CRD YAML (manifests/crds, helm) from the pydantic models
	$(PY) -m nodewright.api.crdgen --write
	$(PY) -m nodewright.webhook.configs > manifests/webhook/webhook-configurations.yaml

.PHONY: lint
lint: venv ## ruff, mypy --strict, import-linter, unused code
	$(VENV)/bin/ruff check nodewright tests e2e benchmarks
	$(VENV)/bin/ruff format --check nodewright tests e2e benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) hack/unused_code.py
	$(PY) -m nodewright.api.crdgen --check

.PHONY: unit
unit: venv helm ## unit and property tests (no cluster)
	$(PY) -m pytest -q tests

.PHONY: e2e
# e2e uses no Hypothesis; its pytest plugin imports modules at session end, where a late ResourceWarning
# turned error can make CPython's AST parser raise SystemError after every test passed.
E2E_PYTEST = $(PY) -m pytest -q -p no:hypothesispytest

e2e: venv controlplane realnode helm ## end-to-end tests against a real local control plane started by the tests (the real-node lane needs root)
	$(E2E_PYTEST) e2e -m "not outside_ci"

.PHONY: e2e-outside-ci
e2e-outside-ci: venv controlplane ## e2e scenarios too long for CI (the full chaos rollout: about 8 min)
	$(E2E_PYTEST) e2e -m outside_ci

.PHONY: bench-smoke
bench-smoke: venv controlplane ## tiny benchmark run so the harness cannot rot
	$(PY) -m benchmarks.run --nodes 50 --smoke

.PHONY: bench
bench: venv controlplane ## scale benchmark (default 1,000 nodes); writes benchmarks/results/
	$(PY) -m benchmarks.run --nodes $${NODES:-1000}

.PHONY: test
test: lint unit e2e bench-smoke ## everything CI runs

.PHONY: demo
demo: venv controlplane realnode ## simulated GPU fleet + operator + a real rollout, progress printed until complete
	$(PY) -m nodewright demo

.PHONY: clean
clean: ## stop any simulated cluster started from this checkout and remove local state
	-$(PY) -m nodewright sim down
	rm -rf .sim build
