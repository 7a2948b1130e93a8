# The two commands a newcomer runs: `make run` and `make test`. Both install what is missing.
BUILD ?= build
JOBS ?= $(shell nproc)
ARGS ?=
# New build folders use Ninja (scripts/setup.sh installs it), the sanitizers' and fuzz/run.sh's
# too: a fresh build of meshsim and the tests (in batches of 8) took 444 s with it and 466 s
# with Makefiles. A folder configured before keeps its generator.
GENERATOR = $(if $(wildcard $(1)/CMakeCache.txt),,-G Ninja)

.PHONY: run test test-torch2 setup build bench sanitize fuzz clean

setup:
	@bash scripts/setup.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(call GENERATOR,$(BUILD)) -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The default simulation: 4 virtual GPUs, DDP, Fashion-MNIST CNN, one epoch. Builds only the
# meshsim binary, not the tests and benchmarks.
run: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target meshsim
	$(BUILD)/meshsim train $(ARGS)

# Builds what the tests run (meshsim and meshsim_tests; the benchmarks compile in `make build`,
# `make bench` and `make test-torch2`), then runs them.
test: setup $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target meshsim meshsim_tests
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The second build: meshsim against PyTorch 2.11's LibTorch from PyPI (its CUDA build: the CUDA
# path compiles and links here, and its tests skip without a card), and the whole suite with
# that PyTorch as the reference (and transformers for the Hugging Face round trip). The wheel
# goes into .torch2/; TORCH_PYTHON=/path/to/python builds against that Python's own PyTorch
# 2.x instead (docs/pytorch.md).
TORCH2_BUILD ?= build-torch2
TORCH_PYTHON ?=
test-torch2: setup
	@python=$${TORCH_PYTHON:-$$(bash scripts/setup_torch2.sh)}; \
	torch=$$($$python -c 'import os, torch; print(os.path.dirname(torch.__file__))') && \
	cmake -S . -B $(TORCH2_BUILD) $(call GENERATOR,$(TORCH2_BUILD)) -DCMAKE_BUILD_TYPE=Release \
	      -DCMAKE_PREFIX_PATH=$$torch -DMESHSIM_PYTHON=$$python
	cmake --build $(TORCH2_BUILD) -j $(JOBS)
	cd $(TORCH2_BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	bash bench/run.sh $(BUILD)

# Runs the whole test suite under ThreadSanitizer, then under AddressSanitizer (the CLI tests
# run the sanitized meshsim binary too). TSan suppresses only reports inside uninstrumented
# libraries (tests/tsan.supp says why). Leak checking is off: LibTorch keeps process-lifetime
# globals (and so does our allocator).
sanitize: setup
	cmake -S . -B build-tsan $(call GENERATOR,build-tsan) -DMESHSIM_SANITIZE=thread -DMESHSIM_BENCH=OFF && cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1" ctest --output-on-failure -j $(JOBS) --timeout 1800
	cmake -S . -B build-asan $(call GENERATOR,build-asan) -DMESHSIM_SANITIZE=address -DMESHSIM_BENCH=OFF && cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j $(JOBS) --timeout 1800

# libFuzzer targets for every parser (fuzz/), under AddressSanitizer and UBSan, built with clang
# in build-fuzz (installed when missing); 5.15 million inputs, about 11 minutes on 2 cores.
# FUZZ_RUNS=N runs every target N times instead.
fuzz: setup
	FUZZ_RUNS=$(FUZZ_RUNS) JOBS=$(JOBS) bash fuzz/run.sh

clean:
	rm -rf $(BUILD) $(TORCH2_BUILD) build-tsan build-asan build-fuzz
