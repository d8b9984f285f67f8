# Wrappers around CMake; the build itself lives in CMakeLists.txt.
#   make demo     build and run the in-memory demo
#   make test     build with warnings as errors and run every test, then again
#                 under AddressSanitizer and UndefinedBehaviorSanitizer
#   make bench    run the benchmarks and rewrite docs/benchmarks.md
#   make install  install the library, header, pkg-config and CMake files

BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_BENCH ?= build-bench
PREFIX     ?= /usr/local
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all demo test test-plain test-asan bench install clean

all: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD)/Makefile:
	@tools/deps.sh build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
		-DHIRATE_BUILD_TESTS=OFF

demo: all
	./$(BUILD)/hirate_demo

test: test-plain test-asan

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

bench:
	@tools/deps.sh bench
	cmake -S . -B $(BUILD_BENCH) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHIRATE_WERROR=ON \
		-DHIRATE_BUILD_TESTS=OFF
	cmake --build $(BUILD_BENCH) -j $(JOBS)
	bench/run.sh $(BUILD_BENCH)

install: all
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_BENCH)
