# TierMoE: the two set-up commands are `make run` and `make test`.
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
# The venv the Python package is built and tested in (scripts/python_env.sh):
# one per machine, outside the checkout, so clones and `make clean` keep it.
VENV       ?= $(HOME)/.cache/tiermoe/venv

.PHONY: all deps build run test test-sanitize bench report-check fuzz fresh-check clean

all: build

deps:
	@scripts/install_deps.sh

$(BUILD)/build.ninja:
	@scripts/install_deps.sh
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The embedded demo: the tiny preset, random init, trained on the built-in
# Markov corpus; the loss is printed beside the corpus's entropy-rate floor.
run: build
	$(BUILD)/tiermoe train

# The C++ suite and the Python package's (tests/python, label python), the
# extension built into $(BUILD)/python against the venv's interpreter.
test: deps
	@scripts/python_env.sh $(VENV)
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIERMOE_PYTHON=ON \
	  -DPython_EXECUTABLE=$(VENV)/bin/python $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer.
# Without the CUDA backend: the CUDA runtime and AddressSanitizer do not mix.
test-sanitize: deps
	cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTIERMOE_SANITIZE=ON -DTIERMOE_CUDA=OFF $(CMAKE_ARGS)
	cmake --build build-sanitize -j $(JOBS)
	cd build-sanitize && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/tiermoe_bench --benchmark_counters_tabular=true

# The run report of a short real training run, rendered in headless Chromium
# (installed when missing) to $(BUILD)/report-check/report-{light,dark}.png;
# fails on a console error or a missing chart. Not part of `make test`.
report-check: build
	@scripts/report_check.sh $(BUILD)

# libFuzzer targets for the file readers (tests/fuzz/), built with clang in
# build-fuzz/, each run FUZZ_SECONDS seconds from the checked-in seed corpus;
# `make test` replays that corpus. Installs clang when missing.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/fuzz.sh $(FUZZ_SECONDS)

# The README's set-up (`make run`, `make test`) on a fresh Debian 12 root built
# with debootstrap under build-fresh/, from a clean clone of HEAD, in a chroot.
# Needs root and the network; not part of `make test`. FRESH_KNOWN_FAILURES=FILE
# names ctest failures to tolerate (one a line). `make clean` keeps build-fresh/.
FRESH_KNOWN_FAILURES ?=
fresh-check:
	@scripts/fresh_check.sh $(if $(FRESH_KNOWN_FAILURES),--known-failures $(FRESH_KNOWN_FAILURES))

clean:
	rm -rf $(BUILD) build-sanitize build-fuzz
