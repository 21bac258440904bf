# The README's two set-up commands: `make run` and `make test`.
# Each installs the missing Debian packages, configures and builds in Release, then runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
DEB_PACKAGES := build-essential cmake pkg-config libopenblas-dev liblapacke-dev \
  libopenmpi-dev openmpi-bin nlohmann-json3-dev libtoml11-dev libcli11-dev libfmt-dev \
  libgtest-dev libbenchmark-dev libsentencepiece-dev libssl-dev python3 python3-torch python3-numpy xz-utils gzip
PYTHON := /usr/bin/python3

.PHONY: deps build run test bench validate clean

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

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./scripts/run-default.sh $(BUILD)

test: build
	cd $(BUILD) && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bench/bench_train_step

validate: build
	$(BUILD)/exatrain validate bench/validation/published_runs.csv

clean:
	rm -rf $(BUILD)
