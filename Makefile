# polar: two commands on a fresh machine, `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export OMP_NUM_THREADS ?= 1
export PYTHONHASHSEED ?= 0

.PHONY: setup demo test test-all harnesses bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Exactly this torch: a CPU wheel of it is on disk; anything else pulls a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,render]'
	touch $@

demo: setup
	# Trains the key-door game through its connector with PPO, then prints the evaluation.
	$(VENV)/bin/polar run --config examples/keydoor/demo.yaml

test: setup
	$(VENV)/bin/pytest -m "not slow" -q

test-all: setup
	$(VENV)/bin/pytest -q

# The coding-agent CLIs the harness presets drive, at the versions they were verified with
# (docs/harnesses.md). Installed locally into .harnesses/ (gitignored); needs Node 20+ and npm.
HARNESS_PKGS := @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 @qwen-code/qwen-code@0.15.10 \
	@google/gemini-cli@0.61.0 @mariozechner/pi-coding-agent@0.73.1

harnesses:
	npm install --no-audit --no-fund --save-exact --prefix .harnesses $(HARNESS_PKGS)

bench: setup
	$(PIP) install -q -e '.[bench]'

lint: setup
	$(VENV)/bin/ruff check polar tests

clean:
	rm -rf $(VENV) runs .pytest_cache
