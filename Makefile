# graphmod: every setup step lives here, so a new machine needs only
#   make demo    (set up, build, train the demo model)
#   make test    (set up, build both ways, run every test)
PYTHON_SYSTEM ?= python3
VENV := .venv
PY := $(abspath $(VENV))/bin/python
PIP := $(PY) -m pip
BAZEL_LIB := bazel-bin/native/_graphmod_ops.so
OPS_LIB := graphmod/_graphmod_ops.so
NATIVE := $(wildcard native/*.cc native/*.h)
# Horovod builds its TF ops against the installed TF, with Gloo and no MPI.
HOROVOD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1

.PHONY: setup build bazel test-bazel native-sanitize test test-tools test-python test-python-all test-bazel-ops demo bench bench-native bench-store clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt Makefile
	test -x $(PY) || $(PYTHON_SYSTEM) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt -r requirements-dev.txt
	$(HOROVOD_ENV) $(PIP) install -q --no-build-isolation horovod==0.28.1
	# The benchmarks' peer; its declared deps would replace our TF.
	$(PIP) install -q --no-deps tensorflow-recommenders-addons==0.7.2
	# A real client for the hook tests (its declared deps would replace our TF too).
	$(PIP) install -q --no-deps deepctr==0.9.4
	touch $@

# pip builds the op library in place (graphmod/_graphmod_ops.so).
build: $(OPS_LIB)
$(OPS_LIB): $(VENV)/.installed $(NATIVE) setup.py pyproject.toml
	$(PIP) install -q --no-build-isolation --no-deps -e .
	touch $@

# The same library and the C++ table test, built offline by Bazel.
bazel: $(VENV)/.installed .bazelrc.user
	scripts/install_bazel.sh
	bazel build //native:_graphmod_ops.so //native:table_test

# Bazel's Python targets run with this checkout's interpreter (.bazelrc),
# and @local_tf finds TensorFlow with it (PYTHON_BIN_PATH), so a plain
# `bazel test //...` works after `make bazel`; the interpreter runs
# through a script: Bazel resolves a symlink like .venv/bin/python to the
# base interpreter, which is outside the venv.
.bazelrc.user: $(VENV)/.installed Makefile
	mkdir -p build
	printf '#!/bin/sh\nexec %s "$$@"\n' "$(abspath $(PY))" > build/venv_python
	chmod +x build/venv_python
	echo "build --incompatible_use_python_toolchains=false --python_path=$(abspath build/venv_python)" > $@
	echo "build --action_env=PYTHON_BIN_PATH=$(abspath $(PY))" >> $@

# Every Bazel test: the C++ table test, and the Python tests that start no
# other process, against the Bazel-built op library (BUILD).
# Bazel's server is stopped after the tests, passed or failed: a test run
# leaves no process behind.
test-bazel: bazel
	status=0; bazel test //... || status=$$?; bazel shutdown; exit $$status

# Every C++ test of the table's parts (native/*_test.cc) under AddressSanitizer
# + UBSan, and the table's concurrency stress under ThreadSanitizer (plain
# g++, no TensorFlow needed). The parts are compiled once per sanitizer and
# linked into each test.
SAN_DIR := build/sanitize
SAN_FLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -pthread -I.
ASAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined
TSAN := -fsanitize=thread
NATIVE_KERNELS := $(addprefix native/,kernels.cc fused_kernels.cc save_kernel.cc restore_kernel.cc \
                    exchange_kernels.cc ops.cc)
NATIVE_TESTS := $(wildcard native/*_test.cc)
TABLE_SOURCES := $(filter-out $(NATIVE_KERNELS) $(NATIVE_TESTS),$(wildcard native/*.cc))
$(SAN_DIR)/asan/%.o: native/%.cc $(wildcard native/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN_FLAGS) $(ASAN) -c $< -o $@
$(SAN_DIR)/tsan/%.o: native/%.cc $(wildcard native/*.h)
	@mkdir -p $(dir $@)
	$(CXX) $(SAN_FLAGS) $(TSAN) -c $< -o $@
ASAN_PARTS := $(patsubst native/%.cc,$(SAN_DIR)/asan/%.o,$(TABLE_SOURCES))
TSAN_PARTS := $(patsubst native/%.cc,$(SAN_DIR)/tsan/%.o,$(TABLE_SOURCES))
native-sanitize: $(ASAN_PARTS) $(TSAN_PARTS) $(patsubst native/%.cc,$(SAN_DIR)/asan/%.o,$(NATIVE_TESTS)) $(SAN_DIR)/tsan/table_test.o $(SAN_DIR)/tsan/log_tier_test.o
	set -e; for t in $(patsubst native/%.cc,%,$(NATIVE_TESTS)); do \
		$(CXX) $(SAN_FLAGS) $(ASAN) $(ASAN_PARTS) $(SAN_DIR)/asan/$$t.o -o $(SAN_DIR)/$${t}_asan; \
		$(SAN_DIR)/$${t}_asan; \
	done
	$(CXX) $(SAN_FLAGS) $(TSAN) $(TSAN_PARTS) $(SAN_DIR)/tsan/table_test.o -o $(SAN_DIR)/table_test_tsan
	TSAN_OPTIONS=halt_on_error=1 $(SAN_DIR)/table_test_tsan --concurrency
	$(CXX) $(SAN_FLAGS) $(TSAN) $(TSAN_PARTS) $(SAN_DIR)/tsan/log_tier_test.o -o $(SAN_DIR)/log_tier_test_tsan
	TSAN_OPTIONS=halt_on_error=1 $(SAN_DIR)/log_tier_test_tsan --concurrency
	$(MAKE) $(SAN_DIR)/table_bench_asan $(SAN_DIR)/table_bench_tsan
	$(SAN_DIR)/table_bench_asan --keys 200000 --batch 16384 --threads 1,3 --timed 2 > /dev/null
	# Many threads on one batch: every phase of a lookup, an apply and a fill.
	TSAN_OPTIONS=halt_on_error=1 $(SAN_DIR)/table_bench_tsan --keys 100000 --batch 65536 \
		--threads 8 --timed 1 --ops train,read,apply > /dev/null

# The table's own many-core benchmark (benchmarks/native/table_bench.cc): one
# static binary without TensorFlow, so it also runs on a host that has none.
# `make bench-native THREADS=1,2,4,8,16` on a large machine; its smoke run
# (small, under ASan/UBSan and ThreadSanitizer) is part of native-sanitize.
THREADS ?= 1,2
build/table_bench: benchmarks/native/table_bench.cc $(TABLE_SOURCES) $(wildcard native/*.h)
	@mkdir -p build
	$(CXX) -std=c++17 -O3 -pthread -static -I. $< $(TABLE_SOURCES) -o $@
$(SAN_DIR)/table_bench_asan: benchmarks/native/table_bench.cc $(ASAN_PARTS)
	$(CXX) $(SAN_FLAGS) $(ASAN) $< $(ASAN_PARTS) -o $@
$(SAN_DIR)/table_bench_tsan: benchmarks/native/table_bench.cc $(TSAN_PARTS)
	$(CXX) $(SAN_FLAGS) $(TSAN) $< $(TSAN_PARTS) -o $@

bench-native: build/table_bench
	build/table_bench --keys 8000000 --dims 16,64 --threads $(THREADS) --dists uniform,zipf \
		--json benchmarks/results/native_table.json

# Chromium and Graphviz from Debian, for the command line's tests.
test-tools:
	scripts/install_test_tools.sh

# Each test module runs once in `make test` (test_ops twice, once per build):
# the modules BUILD lists as py_tests under `bazel test //...` against the
# Bazel-built op library, every other one (all that start processes: Horovod
# ranks, ps clusters, serving, Chromium, the wheel) here against the
# pip-built one. `make test-python-all` runs every module here.
BAZEL_PY_TESTS := $(shell sed -n 's/^    "\(\(rules\/\)\{0,1\}test_[a-z0-9_]*\)",$$/\1/p' BUILD)

test-python: build test-tools
	$(if $(BAZEL_PY_TESTS),,$(error BUILD lists no py_test modules: the list's format changed))
	$(PY) -m pytest -q --durations=15 tests $(BAZEL_PY_TESTS:%=--ignore=tests/%.py)

test-python-all: build test-tools
	$(PY) -m pytest -q tests

# The op tests (which start processes, so not a Bazel py_test) once more,
# against the Bazel-built library.
test-bazel-ops: build bazel
	GRAPHMOD_OPS_LIBRARY=$(abspath $(BAZEL_LIB)) $(PY) -m pytest -q tests/test_ops.py

test: test-bazel native-sanitize test-python test-bazel-ops

demo: build
	$(PY) examples/hook_demo.py

bench: build
	$(PY) benchmarks/lookup.py --regime small --dim 16 --json benchmarks/results/lookup_small_16.json
	$(PY) benchmarks/lookup.py --regime small --dim 64 --json benchmarks/results/lookup_small_64.json
	$(PY) benchmarks/lookup.py --regime large --dim 16 --json benchmarks/results/lookup_large_16.json
	$(PY) benchmarks/lookup.py --regime large --dim 64 --json benchmarks/results/lookup_large_64.json
	$(PY) benchmarks/estimator.py --json benchmarks/results/estimator.json
	$(PY) benchmarks/tiers.py --storage build/bench-tier --json benchmarks/results/tiers.json
	$(MAKE) bench-store

# The disk tier's store against RocksDB (benchmarks/tier_store.cc); Debian's
# librocksdb-dev is the peer, installed here when missing.
/usr/include/rocksdb/db.h:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q librocksdb-dev

TIER_STORE_SOURCES := native/log_tier.cc native/cold_index.cc native/segment_file.cc native/crc32c.cc native/memory.cc
build/tier_store: benchmarks/tier_store.cc $(TIER_STORE_SOURCES) $(TIER_STORE_SOURCES:.cc=.h) /usr/include/rocksdb/db.h
	mkdir -p build
	$(CXX) -std=c++17 -O2 -pthread -I. benchmarks/tier_store.cc $(TIER_STORE_SOURCES) -lrocksdb -o $@

bench-store: build/tier_store setup
	$(PY) benchmarks/tier_store.py --storage build/bench-store --json benchmarks/results/tier_store.json

clean:
	rm -rf build *.egg-info $(OPS_LIB) graphmod/_graphmod_ops.json .bazelrc.user
	-bazel clean
