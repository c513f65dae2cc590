# tfcluster: one-off distributed TensorFlow training clusters.   make up train down
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec
.DEFAULT_GOAL := help

##@ Knobs (override on the command line: make up WORKERS=3)
PROVIDER ?= ## local (default), aws, gcp, openstack, im
CLUSTER ?=  ## the cluster's name (default tfc); its state in .tfcluster/<name>/
CONFIG ?=   ## a cluster file (examples/*.yml); the knobs here override it
STRATEGY ?= ## parameter_server (default) or multi_worker_mirrored
PS ?=       ## parameter-server nodes (PS=0 with multi_worker_mirrored)
WORKERS ?=  ## worker nodes
STEPS ?=    ## training steps
FORCE ?=    ## FORCE=1: down (and clean) past the guard that keeps a model not yet safe
NODE ?=     ## make logs NODE=<node>
RUN ?=      ## make tensorboard RUN=<run id>
SWEEP ?=    ## a sweep file: make sweep / all / up SWEEP=sweep.yml
PORT ?=     ## make tensorboard PORT=<port>
SET ?=      ## SET='KEY=VALUE ...': any field of the cluster file, e.g. SET='training.learning_rate=0.01'
VENV ?= .venv
PYTEST_ARGS ?=
STRATEGIES ?=
MODELS ?=
THREADS ?=
SCALE ?=
BENCH_ARGS ?=

TFCLUSTER = $(VENV)/bin/tfcluster
CONFIG_ARGS = $(if $(CONFIG),--config $(CONFIG)) $(if $(CLUSTER),--cluster $(CLUSTER)) \
	$(if $(PROVIDER),--provider $(PROVIDER)) $(if $(STRATEGY),--set strategy=$(STRATEGY)) $(if $(PS),--ps $(PS)) \
	$(if $(WORKERS),--workers $(WORKERS)) $(if $(STEPS),--steps $(STEPS)) $(foreach s,$(SET),--set '$(subst ','\'',$(s))')
BOOTSTRAP = $(VENV)/.tfcluster-installed
# `make up train down`: when `down` is a goal, a failed (or interrupted) up or train tears the cluster down
# itself (Make stops at the first failing goal, so the `down` goal would never run)
DOWN_ON_FAILURE = $(if $(filter down,$(MAKECMDGOALS)),--down-on-failure $(if $(FORCE),--force))
SWEEP_ARGS = $(if $(SWEEP),--sweep $(SWEEP))

##@ Help
.PHONY: help
help: ## Show this help (the default goal)
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m [KNOB=value ...]\n"} \
	/^[a-zA-Z_-]+:.*?##/ { printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2 } \
	/^[A-Z_]+ +\?= *##/ { split($$0, k, / *\?= *## */); printf "  \033[36m%-12s\033[0m %s\n", k[1], k[2] } \
	/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Set-up
$(BOOTSTRAP): requirements.lock requirements-checkov.lock pyproject.toml train/pyproject.toml scripts/bootstrap.sh scripts/uv_setup.py
	VENV=$(VENV) ./scripts/bootstrap.sh

.PHONY: bootstrap
bootstrap: $(BOOTSTRAP) ## Install apt packages and the controller venv (done automatically on first use)

.PHONY: example-data
example-data: $(BOOTSTRAP) ## Write the examples' data (examples/README.md) to the store, starting the local one if needed
	$(TFCLUSTER) example-data $(CONFIG_ARGS)

##@ A run
.PHONY: image
image: $(BOOTSTRAP) ## Bake the node image (TensorFlow and the rest of the roles but tf_node) once per content key; up uses it
	$(TFCLUSTER) image $(CONFIG_ARGS)

.PHONY: all
all: $(BOOTSTRAP) ## up, train, down: down runs after success, failure and Ctrl-C (exit status: the first failure; SWEEP=file: a sweep)
	$(TFCLUSTER) all $(CONFIG_ARGS) $(SWEEP_ARGS) $(if $(FORCE),--force)

.PHONY: validate
validate: $(BOOTSTRAP) ## Check the configuration and print it with defaults filled in
	$(TFCLUSTER) validate $(CONFIG_ARGS)

.PHONY: plan
plan: $(BOOTSTRAP) ## Show what up would create (nodes, Terraform plan or RADL, network, deadline, model), creating nothing (SWEEP=file: its trials and groups)
	$(TFCLUSTER) plan $(CONFIG_ARGS) $(SWEEP_ARGS)

.PHONY: up
up: $(BOOTSTRAP) ## Provision the cluster (local provider by default) and wait until every node runs its Python over SSH, through sudo for a non-root login (SWEEP=file: its groups)
	$(TFCLUSTER) up $(CONFIG_ARGS) $(SWEEP_ARGS) $(DOWN_ON_FAILURE)

.PHONY: train
train: $(BOOTSTRAP) ## Configure the nodes, train, publish the model to S3 and verify it
	$(TFCLUSTER) train $(CONFIG_ARGS) $(DOWN_ON_FAILURE)

.PHONY: sweep
sweep: $(BOOTSTRAP) ## Run or resume a sweep (SWEEP=sweep.yml): trials side by side on the cluster's groups, a table by metric
	$(TFCLUSTER) sweep $(CONFIG_ARGS) --sweep $(if $(SWEEP),$(SWEEP),$(error SWEEP=<sweep file> is required)) $(DOWN_ON_FAILURE)

.PHONY: down
down: $(BOOTSTRAP) ## Destroy the cluster and prove nothing remains (FORCE=1 to skip the model guard)
	$(TFCLUSTER) down $(CONFIG_ARGS) $(if $(FORCE),--force)

.PHONY: status
status: $(BOOTSTRAP) ## Nodes, roles, addresses, SSH and training state
	$(TFCLUSTER) status $(CONFIG_ARGS)

.PHONY: logs
logs: $(BOOTSTRAP) ## Show a node's log: make logs NODE=tfc-chief-0
	$(TFCLUSTER) logs $(CONFIG_ARGS) $(NODE)

.PHONY: tensorboard
tensorboard: $(BOOTSTRAP) ## TensorBoard on 127.0.0.1 for the cluster's runs in S3 (RUN=id: one run; SWEEP=file: its trials; PORT=n), until Ctrl-C
	$(TFCLUSTER) tensorboard $(CONFIG_ARGS) $(if $(RUN),--run $(RUN)) $(SWEEP_ARGS) $(if $(PORT),--port $(PORT))

##@ Development
.PHONY: test
# test files run on this many pytest-xdist workers at once, each file whole on one worker (its clusters and
# module fixtures stay together); the slow files first (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: $(BOOTSTRAP) ## Run the whole test suite (unit, lint, integration, end to end) on TEST_WORKERS workers
	VENV=$(VENV) ./scripts/bootstrap.sh --test
	$(VENV)/bin/pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) \
		--durations=15 $(PYTEST_ARGS) tests

.PHONY: lint
lint: $(BOOTSTRAP) ## ruff, terraform fmt, ansible-lint and checkov (offline)
	$(VENV)/bin/pytest -q tests/lint

.PHONY: lock
lock: $(BOOTSTRAP) ## Regenerate the hash-pinned lock files (controller, checkov, nodes) from their inputs
	$(VENV)/bin/python scripts/lock.py

.PHONY: clean
clean: $(BOOTSTRAP) ## Stop the local S3 store (its objects go with it); refused while clusters are up unless FORCE=1
	$(TFCLUSTER) store stop $(if $(FORCE),--force)

.PHONY: bench
bench: $(BOOTSTRAP) ## Benchmark models x strategies vs one plain process: ex/s, ratio, coordination ms/step, peak memory, phases (SCALE=1: configure 4 and 12 nodes, and 4 on the bare base image)
	$(VENV)/bin/python scripts/bench.py $(if $(CLUSTER),--cluster $(CLUSTER)) $(if $(STEPS),--steps $(STEPS)) \
		$(if $(STRATEGIES),--strategies $(STRATEGIES)) $(if $(MODELS),--models $(MODELS)) \
		$(if $(THREADS),--threads $(THREADS)) $(if $(SCALE),--scale) $(BENCH_ARGS)

.PHONY: reliability
reliability: $(BOOTSTRAP) ## Fault scenarios on a local cluster, with a report of each outcome and its time
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/reliability
