JOBS  ?= $(shell nproc)
BUILD ?= build
CONFIG := configs/fashion_mnist_mlp.yaml

.PHONY: build deps deps-sanitizers train test test-fast bench asan tsan fuzz clean

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

deps:
	bash .ci/deps.sh

train: build
	./$(BUILD)/shardwild train $(CONFIG) $(ARGS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) $(CTEST_ARGS)

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE slow $(CTEST_ARGS)

bench: build
	./$(BUILD)/shardwild bench $(CONFIG) $(ARGS)

# The ASan+UBSan build is clang's (GCC takes 2.5x as long to compile the
# same sources with ASan+UBSan), and it is also the fuzz build: the libraries
# carry libFuzzer's coverage, and the `fuzzers` targets are built with the
# suite (see fuzz below).
asan: deps-sanitizers
	cmake --preset asan -G Ninja
	cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS) -LE slow $(CTEST_ARGS)

deps-sanitizers:
	bash .ci/deps.sh --sanitizers

# The sanitizer suites leave out the tests labelled `slow` (the acceptance
# runs of the shipped configs on data of realistic size: the same code paths
# as the small unit runs, 10-50x slower under a sanitizer; and the allreduce
# ranks killed mid-run, whose in-process part allreduce_test covers); `make
# test` runs them.
# TSan on Debian 12 kernels needs ASLR disabled ("unexpected memory mapping").
# Debian's gRPC is not built for TSan: the net tests link
# tests/net/tsan_grpc_suppressions.cc, which says why and what it ignores.
tsan: deps
	cmake --preset tsan -G Ninja
	cmake --build build-tsan -j $(JOBS)
	setarch $$(uname -m) -R ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -LE slow $(CTEST_ARGS)

# Every libFuzzer target from its seed corpus for FUZZ_SECONDS (default 60)
# each, clang with ASan+UBSan; fails on a finding (tests/fuzz/run.sh).
# In build-asan/, so after `make asan` nothing is left to build.
fuzz: deps-sanitizers
	cmake --preset asan -G Ninja
	cmake --build build-asan -j $(JOBS) --target fuzzers
	tests/fuzz/run.sh build-asan

clean:
	rm -rf $(BUILD) build-asan build-tsan
