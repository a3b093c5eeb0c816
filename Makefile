# evtc: the two commands a fresh machine needs are `make run` and `make test`.
# Both run scripts/setup.sh first (installs Debian packages and the CUTLASS headers if missing).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
EXAMPLE ?= examples/w1_bias_silu.evt

.PHONY: setup build run test test-gpu test-sanitize sanitize-gpu bench clean

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || (cat $(BUILD).configure.log; exit 1)
	@cmake --build $(BUILD) -j $(JOBS)

# The main job: explain an example epilogue; with a GPU, run it fused and check it
# against the fp64 reference; without one, compile its kernel with nvcc.
run: build
	@bash scripts/run_example.sh $(BUILD) $(EXAMPLE)

# PyTorch (for the Python tests) downloads beside CTest, which keeps the CPUs busy meanwhile.
test: build
	@bash tests/python/install_torch.sh > $(BUILD)/install-torch.log 2>&1 & torch=$$!; \
	  (cd $(BUILD) && ctest --output-on-failure -j $(JOBS)); rc=$$?; \
	  wait $$torch || { cat $(BUILD)/install-torch.log; exit 1; }; \
	  cat $(BUILD)/install-torch.log; exit $$rc
	@bash tests/python/run_cpu_tests.sh

# On a GPU machine without network access, give the CUTLASS headers by path:
#   make test-gpu CUTLASS_DIR=/path/to/cutlass
test-gpu:
	@if [ -z "$(CUTLASS_DIR)" ]; then bash scripts/setup.sh; fi
	@cmake -S . -B $(BUILD)-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEVTC_BUILD_GPU_TESTS=ON $(if $(CUTLASS_DIR),-DCUTLASS_DIR=$(CUTLASS_DIR)) $(CMAKE_FLAGS) > $(BUILD)-gpu.configure.log 2>&1 || (cat $(BUILD)-gpu.configure.log; exit 1)
	@cmake --build $(BUILD)-gpu -j $(JOBS)
	@cd $(BUILD)-gpu && ctest --output-on-failure -L gpu

# compute-sanitizer (memcheck, racecheck, synccheck) over one kernel of each kind, on a GPU
# machine; scripts/sanitize-gpu.sh lists them. Any error or mismatch fails.
sanitize-gpu: build
	@bash scripts/sanitize-gpu.sh $(BUILD)/evtc

# The CPU unit tests (and the evtc command they run) built with AddressSanitizer and
# UndefinedBehaviorSanitizer; any finding fails the run.
SANITIZE_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
test-sanitize: setup
	@cmake -S . -B $(BUILD)-sanitize -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS="$(SANITIZE_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(SANITIZE_FLAGS)" \
	  -DCMAKE_SHARED_LINKER_FLAGS="$(SANITIZE_FLAGS)" $(CMAKE_FLAGS) > $(BUILD)-sanitize.configure.log 2>&1 \
	  || (cat $(BUILD)-sanitize.configure.log; exit 1)
	@cmake --build $(BUILD)-sanitize -j $(JOBS) --target evtc_unit_tests evtc_cli
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(BUILD)-sanitize/tests/evtc_unit_tests

clean:
	rm -rf $(BUILD) $(BUILD)-gpu $(BUILD)-sanitize $(BUILD).configure.log $(BUILD)-gpu.configure.log \
	  $(BUILD)-sanitize.configure.log
