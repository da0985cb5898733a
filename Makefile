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
AGENT_SIDE := streamfl protocol sensors models agent dvfs

.PHONY: demo test venv lint bench load eval-adaclp golden clean

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

# Load and soak (bench/load.py): 300 paho agents against the real coordinator for 4 minutes, then
# again restarting the broker and the coordinator; minutes each, so not part of `make bench`.
load: $(STAMP)
	$(BIN)/python bench/load.py
	$(BIN)/python bench/load.py --chaos

# AdaCLP's comparison (docs/results.md): every method of the paper, 3 seeds, smartwatch and synthetic
# data, extreme and non-extreme settings, then the lambda sweep. Hours on 2 cores; runs/eval/ holds it.
ADACLP_METHODS := fedasync,fedavg,fedcurv,afedcurv,criticalfl,fedcurv+clp,adaclp,adaclp-fixed-low,adaclp-no-dvfs
# Variants of the extreme setting (docs/results.md): compute-bound boards, whose rounds the clock
# level lengthens as in the paper (a round each 1 s at most, slower per-sample timings), and
# class periods of 150 s instead of 40 s over 1200 s. The ablations switch off one of eq. 4-6 each:
# dropout D0 = 0, batch size held at B0, lr held at eta0.
ADACLP_BUSY := --set agent.round_interval_s=1.0 --set devices.0.seconds_per_sample_s=0.003 \
  --set devices.1.seconds_per_sample_s=0.0015 --set devices.2.seconds_per_sample_s=0.001 \
  --set devices.3.seconds_per_sample_s=0.006
ADACLP_LONG := --duration 1200 --set stream.params.mu_s=150 --set stream.params.sigma_s=20
eval-adaclp: $(STAMP)
	$(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods $(ADACLP_METHODS) --out runs/eval/extreme-watch --report
	$(BIN)/streamfl sim configs/scenarios/adaclp-nonextreme.yaml --seeds 3 --methods $(ADACLP_METHODS) --out runs/eval/nonextreme-watch --report
	$(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods $(ADACLP_METHODS) --set data.dataset=synthetic --out runs/eval/extreme-synthetic --report
	$(BIN)/streamfl sim configs/scenarios/adaclp-nonextreme.yaml --seeds 3 --methods $(ADACLP_METHODS) --set data.dataset=synthetic --out runs/eval/nonextreme-synthetic --report
	for lam in 1 0.1 0.01 0.001; do \
	  $(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods adaclp --set plugins.clp.lam=$$lam --out runs/eval/lambda-$$lam --report; \
	done
	for lr in 0.02 0.1; do \
	  $(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods fedasync --set coordinator.hparams.lr=$$lr --out runs/eval/fedasync-lr-$$lr; \
	done
	$(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods fedasync,adaclp,adaclp-fixed-low,adaclp-no-dvfs $(ADACLP_BUSY) --out runs/eval/extreme-watch-busy --report
	$(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods fedasync,adaclp $(ADACLP_LONG) --out runs/eval/extreme-watch-long --report
	for knob in "clp.d0=0.0" "clp.batch_min=32" "clp.lr_min=0.05"; do \
	  $(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods adaclp-no-dvfs --set agent.plugins.$$knob --out runs/eval/ablation-$$knob; \
	done
	$(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods adaclp --set agent.plugins.clp.lr_min=0.05 --out runs/eval/extreme-watch-lr-held
	$(BIN)/streamfl sim configs/scenarios/adaclp-extreme.yaml --seeds 3 --methods adaclp --set agent.plugins.clp.lr_min=0.05 $(ADACLP_BUSY) --out runs/eval/extreme-watch-busy-lr-held
	$(BIN)/python bench/bench_fisher.py

# Re-record the simulator figures tests/test_golden_sim.py holds every method to (seed 0, two short
# scenarios); only after a deliberate behaviour change, said in the commit.
golden: $(STAMP)
	$(BIN)/python tests/golden/record.py --write

clean:
	rm -rf $(VENV) build dist *.egg-info runs
