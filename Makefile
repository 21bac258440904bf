# The README's two set-up commands: `make run` and `make test`.
# Each installs the missing Debian packages, configures and builds in Release, then runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
DEB_PACKAGES := build-essential cmake pkg-config libopenblas-dev liblapacke-dev libdnnl-dev \
  libopenmpi-dev openmpi-bin nlohmann-json3-dev libtoml11-dev libcli11-dev libfmt-dev \
  libgtest-dev libbenchmark-dev libsentencepiece-dev libssl-dev python3 xz-utils gzip
# Only the tests and `make bench` compare with PyTorch: `make run` does not install it.
TEST_PACKAGES := python3-torch python3-numpy
PYTHON := /usr/bin/python3
# `make fuzz` and `make sanitize` (both run by CI, .ci/run, after `make test`) also need clang with
# libFuzzer and the sanitizer runtimes, and its OpenMP runtime: installed by those targets only.
FUZZ_PACKAGES := clang libclang-rt-14-dev libomp-dev llvm
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
# ASan + UBSan (every UBSan report is fatal); -fsanitize=fuzzer-no-link instruments the library
# for libFuzzer's coverage (the unit tests link without libFuzzer).
SAN_FLAGS := -O1 -gline-tables-only -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
  -Wno-pass-failed -Wno-unknown-warning-option
# The unit tests that also run under the sanitizers: the readers (checkpoint, data, report), the
# job parser, the training loop (session, train), the bad-input tests and core.
SAN_ROOMS := core;job;checkpoint;data;report;session;train;bad_inputs

.PHONY: deps deps-fuzz deps-test build run test bench validate clean fuzz-build fuzz sanitize

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing missing Debian packages:" $$missing; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	  else \
	    echo "missing Debian packages; run:"; echo "  sudo apt-get install -y" $$missing; exit 1; \
	  fi; \
	fi

deps-fuzz:
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(FUZZ_PACKAGES)"

deps-test:
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(TEST_PACKAGES)"

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./scripts/run-default.sh $(BUILD)

test: build deps-test
	cd $(BUILD) && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS)

bench: build deps-test
	$(BUILD)/bench/bench_train_step

validate: build
	$(BUILD)/exatrain validate bench/validation/published_runs.csv

# The sanitizer build directory, shared by the fuzz harnesses and the sanitizer unit tests. Without
# the CUDA backend: the harnesses and tests it runs are CPU code, and ASan's shadow memory and the
# CUDA runtime do not mix without protect_shadow_gap=0 (the CUDA code is checked by
# compute-sanitizer instead: tests/cuda, docs/cuda.md).
fuzz-build: deps deps-fuzz
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Sanitize -DEXATRAIN_CUDA=OFF \
	  -DCMAKE_CXX_FLAGS="$(SAN_FLAGS) -fsanitize=fuzzer-no-link" -DEXATRAIN_FUZZ=ON -DEXATRAIN_BENCH=OFF \
	  -DEXATRAIN_TEST_ROOMS="$(SAN_ROOMS)"
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all

# Every harness for FUZZ_SECONDS (default 60) on a copy of its seed corpus, FUZZ_JOBS (default: the
# CPU count) at once; fails on any finding.
fuzz: fuzz-build
	fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# The unit tests of SAN_ROOMS built and run under ASan + UBSan, leaks included. What Open MPI
# allocates once per process and never frees is suppressed (fuzz/lsan.supp: its libraries only);
# its components stay loaded and the slow unwinder runs, so that those frames have names.
sanitize: fuzz-build
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	cd $(FUZZ_BUILD) && OMP_NUM_THREADS=1 OMPI_MCA_mca_base_component_disable_dlclose=1 \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:fast_unwind_on_malloc=0 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/fuzz/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD)
