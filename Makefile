# Wrappers around CMake; the build itself lives in CMakeLists.txt.
#   make demo     build and run the in-memory demo
#   make test     build with warnings as errors and run every test: the C tests
#                 (plain, then under ASan+UBSan, then the stress test under
#                 TSan), the Python tests (plain, then with the extension under
#                 ASan+UBSan), the Lua and nginx tests, a short run of every
#                 fuzz target, the cross-language integration tests, the
#                 repaired wheel with no compiler, headers or libhiredis
#                 (test-wheel), and Python 3.9, 3.10, 3.12 and 3.13
#                 (test-python-versions)
#   make fuzz     run every fuzz target longer (FUZZ_SECONDS each, default 60)
#   make bench    run the benchmark suite (hirate next to its peers, the C
#                 benchmarks) and rewrite docs/benchmarks.md and its charts;
#                 make bench QUICK=1: a short check, written to bench/out/quick/
#   make install  install the library, header, pkg-config and CMake files
#                 under PREFIX (default /usr/local), whenever the build was
#                 configured

BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_BENCH ?= build-bench
BUILD_TSAN ?= build-tsan
FUZZ_SECONDS ?= 60
PREFIX     ?= /usr/local
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all demo test test-plain test-asan test-tsan test-python test-lua test-fuzz fuzz \
	test-python-asan test-integration test-wheel test-python-versions bench install clean

all: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/Makefile:
	@tools/deps.sh build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
		-DHIRATE_BUILD_TESTS=OFF

demo: all
	./$(BUILD)/hirate_demo

test: test-plain test-asan test-tsan test-python test-lua test-fuzz \
	test-python-asan test-integration test-wheel test-python-versions

test-plain:
	@tools/deps.sh test
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
		-DHIRATE_BUILD_TESTS=ON
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan:
	@tools/deps.sh test
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DHIRATE_WERROR=ON \
		-DHIRATE_SANITIZE=address,undefined -DHIRATE_BUILD_TESTS=ON -DHIRATE_BUILD_BENCH=OFF
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
		UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		ctest --output-on-failure -j $(JOBS)

# TSan: the programs that share one limiter among many threads.
test-tsan:
	@tools/deps.sh test
	cmake -S . -B $(BUILD_TSAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
		-DHIRATE_SANITIZE=thread -DHIRATE_BUILD_TESTS=ON -DHIRATE_BUILD_BENCH=OFF
	cmake --build $(BUILD_TSAN) -j $(JOBS)
	cd $(BUILD_TSAN) && TSAN_OPTIONS=halt_on_error=1:detect_deadlocks=0 \
		ctest --output-on-failure -j $(JOBS) -L tsan

test-python:
	@tools/deps.sh python
	tests/python/run.sh

test-lua:
	@tools/deps.sh lua
	tests/lua/run.sh

# The wheel as pip users get it: python -m build, auditwheel repair (manylinux),
# then the Python suite against the installed wheel with no compiler, no
# headers and no libhiredis on the machine (a mount namespace hides them).
test-wheel:
	@tools/deps.sh wheel
	tests/python/wheel.sh

# The extension built and the Python suite run on 3.9, 3.10, 3.12 and 3.13
# (those of pyenv, else pythonX.Y, else fetched by uv), the server-heavy
# files aside.
test-python-versions:
	@tools/deps.sh python
	tests/python/versions.sh

# The Python tests again, the extension built with ASan and UBSan.
test-python-asan:
	@tools/deps.sh python
	tests/integration/python_asan.sh

# C, Python and Lua together: the bad-input sweeps of C and the CLI, and the
# invariants of one Redis key under load from all of them at once.
test-integration:
	@tools/deps.sh python
	@tools/deps.sh lua
	tests/integration/run.sh

test-fuzz:
	@tools/deps.sh fuzz
	tests/fuzz/run.sh 10

fuzz:
	@tools/deps.sh fuzz
	tests/fuzz/run.sh $(FUZZ_SECONDS)

bench:
	@tools/deps.sh bench
	cmake -S . -B $(BUILD_BENCH) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
		-DHIRATE_BUILD_TESTS=OFF
	cmake --build $(BUILD_BENCH) -j $(JOBS)
	QUICK=$(QUICK) bench/run.sh $(BUILD_BENCH)

install: all
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_BENCH) $(BUILD_TSAN) build-py build-py-asan \
		build-lua build-fuzz build-integration build-wheel build-pyver build-rock
