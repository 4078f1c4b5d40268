# sparkserve: `make serve` and `make test` install what they need, build, and run.
SHELL := /bin/bash
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
# The built-in default model for `make serve`: tiny random MoE weights with the real Qwen3.5
# tokenizer (248k vocab) and chat template, generated into the build folder on first use.
MODEL ?= $(BUILD_DIR)/serve-tiny
SERVED_MODEL_NAME ?= sparkserve-tiny
# auto: the GPU when this build has the CUDA backend and one answers, else the CPU.
DEVICE ?= auto
HOST ?= 127.0.0.1
PORT ?= 8000
# Seconds each fuzz target runs in `make test` (a smoke run; longer runs: tests/fuzz/run_fuzz.sh N).
FUZZ_SECONDS ?= 10
# `make fuzz`: every fuzz target until FUZZ_RUNS executions, FUZZ_MAX_SECONDS at most each.
FUZZ_RUNS ?= 1000000
FUZZ_MAX_SECONDS ?= 3600
# `make sanitize-test`: the unit and server suites on an ASan + UBSan build (CPU only). A finding
# aborts the process (abort_on_error, halt_on_error, -fno-sanitize-recover=undefined) and fails
# its test; leaks are checked at exit.
ASAN_DIR ?= build-asan
SANITIZER_ENV := ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:disable_coredump=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
UNIT_TARGETS := $(patsubst tests/unit/%,unit_%,$(wildcard tests/unit/*))
# The CUDA backend is compiled wherever nvcc exists (CI has nvcc but no GPU; GPU tests then skip).
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(NVCC),)
CUDA_FLAGS := -DSPARKSERVE_CUDA=OFF
else
CUDA_FLAGS := -DSPARKSERVE_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC)
endif
APT_PACKAGES := build-essential cmake ninja-build pkg-config git \
  nlohmann-json3-dev libcpp-httplib-dev libboost-dev libcli11-dev libpcre2-dev libutf8proc-dev \
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-venv python3-pip \
  libjpeg62-turbo-dev libpng-dev libwebp-dev libgif-dev \
  chromium chromium-driver

.PHONY: all deps apt-deps py-deps build test sanitize-test fuzz serve bench clean

all: build

apt-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# Test oracles (HF tokenizers, jinja2, numpy, openai SDK ...) live in a project venv.
$(VENV)/.stamp: tests/requirements.txt | apt-deps
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r tests/requirements.txt
	@touch $@

py-deps: $(VENV)/.stamp

deps: apt-deps py-deps

$(BUILD_DIR)/build.ninja: CMakeLists.txt | apt-deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DSPARKSERVE_PYTHON=$(PY) $(CUDA_FLAGS)

build: apt-deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: deps build
	FUZZ_RUNS= tests/fuzz/run_fuzz.sh $(FUZZ_SECONDS)
	cd $(BUILD_DIR) && ctest -j $(JOBS) --output-on-failure

# Neither is part of `make test` (hours of CPU on CI's 2 cores); see docs/serving-engine.md.
sanitize-test: deps
	cmake -S . -B $(ASAN_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSPARKSERVE_SANITIZE=ON \
	  -DSPARKSERVE_CUDA=OFF -DSPARKSERVE_PYTHON=$(PY)
	cmake --build $(ASAN_DIR) -j $(JOBS) --target sparkserve sparkserve_scripted $(UNIT_TARGETS)
	cd $(ASAN_DIR) && $(SANITIZER_ENV) ctest -j $(JOBS) -L unit --output-on-failure
	cd $(ASAN_DIR) && $(SANITIZER_ENV) ctest -R py_server --output-on-failure

fuzz: apt-deps
	FUZZ_RUNS=$(FUZZ_RUNS) tests/fuzz/run_fuzz.sh $(FUZZ_MAX_SECONDS)

serve: build
	@if [ "$(MODEL)" = "$(BUILD_DIR)/serve-tiny" ]; then \
	  python3 tests/fixtures/serve-tiny/make_model.py $(BUILD_DIR)/sparkserve $(BUILD_DIR)/serve-tiny; fi
	$(BUILD_DIR)/sparkserve serve $(MODEL) --served-model-name $(SERVED_MODEL_NAME) --host $(HOST) --port $(PORT) --device $(DEVICE)

bench: build
	@echo "see bench/README.md"

clean:
	rm -rf $(BUILD_DIR)
