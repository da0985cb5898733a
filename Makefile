# The two commands of the README: `make demo` and `make test`, each setting itself up from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
# Boards install NVIDIA's or the Pi's torch wheel themselves; here the CPU build is pinned by version.
TORCH ?= torch==2.13.0
# Extra pip arguments for the torch install, e.g. a CPU-only wheel index where PyPI would serve CUDA.
TORCH_PIP_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.streamfl-installed
# Folders that run on the boards, checked for Python 3.8 (JetPack 5) compatibility.
AGENT_SIDE := common protocol sensors models agent dvfs

.PHONY: demo test venv lint bench clean

venv: $(STAMP)

$(STAMP): setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,server,data]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/streamfl demo

lint: $(STAMP)
	$(BIN)/vermin -t=3.8- --no-tips --violations --eval-annotations $(AGENT_SIDE)

test: lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python bench/bench_codec.py
	$(BIN)/python bench/bench_coordinator.py
	$(BIN)/python bench/bench_buffer.py
	$(BIN)/python bench/bench_dvfs.py
	$(BIN)/python bench/bench_fisher.py
	$(BIN)/python bench/sim.py

clean:
	rm -rf $(VENV) build dist *.egg-info runs
