# tryll_fast developer entry points. Everything runs inside .venv (Python 3.11).
#   make test    install (builds the Cython extensions), run the tests, list the slowest
#   make bench   run the benchmarks, then the gates (exits non-zero on a FAIL)
#   make llama-server  build the peer benchmark's llama-server once (make bench needs it)
#   make fuzz    a longer atheris campaign on the codec
#   make fuzz-server  mutated frames of every request type against a live server
#   make soak / make flood  a careless workload / a million-frame flood, back to baseline
#   make gen     regenerate checked-in code from schema/
#   make serve   install, fetch the default models, serve on 127.0.0.1:9100 (TCP) and
#                127.0.0.1:9101 (the pipeline: WebSocket /pipeline, Socket.IO, the example agents)

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
SOURCES := setup.py pyproject.toml $(wildcard csrc/*.h csrc/*.hpp) \
           $(wildcard tryll_fast/*/*.pyx tryll_fast/*/*.pxi tryll_fast/*/*.pxd tryll_fast/*/*/*.pyx)
FUZZ_RUNS ?= 2000000
# make serve: where models are fetched (shared with the tests' build/models) and extra flags
MODELS_DIR ?= build/models
SERVE_ARGS ?=
# make serve: the pipeline transport's agents (ws://127.0.0.1:9101/pipeline?agent=innkeeper)
PIPELINE_CONFIG ?= tryll_fast/gateway/example.toml
PYTEST_ARGS ?=

# llama-cpp-python compiles llama.cpp with -march=native. On a CPU that advertises AMX this
# builds AMX tile kernels, and on the VMs here they fault (GPF on LDTILECFG) at the first
# decode, so AMX is compiled out (-mno-* wins over -march=native in GCC). pip's own wheel
# cache ignores CMAKE_ARGS, so the wheel is built once into a cache of ours, named after the
# version and the flags, and installed from there: compiled from source once per machine.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CFLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_WHEELS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tryll_fast/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)-noamx
LLAMA_WHEEL := $(LLAMA_WHEELS)/.built

# The peer benchmark (benchmarks/test_peer_llama_server.py) runs llama.cpp's own
# llama-server, built from the vendor/llama.cpp of the same sdist with the same AMX-off
# flags, so both sides run the same kernels. Static, no OpenSSL, no web UI download, and
# only the llama-server target: built once per machine into the cache and reused.
LLAMA_SERVER_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tryll_fast/llama-server-$(LLAMA_CPP_VERSION)-noamx
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/llama-server
export TRYLL_LLAMA_SERVER := $(LLAMA_SERVER)

# The vector index compiles USearch's header-only C++ (tryll_fast/knowledge/_vindex.pyx):
# the headers come from the pinned usearch sdist, fetched once per machine into the cache.
USEARCH_VERSION := 2.26.6
USEARCH_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tryll_fast/usearch-$(USEARCH_VERSION)
USEARCH_HEADERS := $(USEARCH_DIR)/include/usearch/index_dense.hpp
export TRYLL_USEARCH_INCLUDE := $(USEARCH_DIR)/include

.PHONY: test bench soak flood fuzz fuzz-server gen serve install clean profile-build llama-server

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(LLAMA_WHEEL): | $(PY)
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS='-DCMAKE_C_FLAGS="$(LLAMA_CFLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CFLAGS)"' \
		$(PIP) wheel --quiet --no-deps --no-binary llama-cpp-python --no-cache-dir \
		-w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@

# pip download of the sdist alone: with --no-binary :all: pip would also compile the build
# backend's own requirements (cmake itself) from source just to read the metadata.
$(LLAMA_SERVER): | $(PY)
	rm -rf $(LLAMA_SERVER_DIR)/src && mkdir -p $(LLAMA_SERVER_DIR)/src
	$(PIP) download --quiet --no-deps --no-binary llama-cpp-python --no-cache-dir \
		-d $(LLAMA_SERVER_DIR)/src llama-cpp-python==$(LLAMA_CPP_VERSION)
	tar -xzf $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz \
		-C $(LLAMA_SERVER_DIR)/src
	cmake -S $(LLAMA_SERVER_DIR)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp \
		-B $(LLAMA_SERVER_DIR)/src/build -DCMAKE_BUILD_TYPE=Release \
		-DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
		-DCMAKE_C_FLAGS="$(LLAMA_CFLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CFLAGS)" \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
		-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
	cmake --build $(LLAMA_SERVER_DIR)/src/build --target llama-server -j 2
	cp $(LLAMA_SERVER_DIR)/src/build/bin/llama-server $@.tmp && mv $@.tmp $@
	rm -rf $(LLAMA_SERVER_DIR)/src

llama-server: $(LLAMA_SERVER)

$(USEARCH_HEADERS): | $(PY)
	rm -rf $(USEARCH_DIR)/src && mkdir -p $(USEARCH_DIR)/src
	$(PIP) download --quiet --no-deps --no-binary usearch --no-cache-dir \
		-d $(USEARCH_DIR)/src usearch==$(USEARCH_VERSION)
	tar -xzf $(USEARCH_DIR)/src/usearch-$(USEARCH_VERSION).tar.gz -C $(USEARCH_DIR)/src
	rm -rf $(USEARCH_DIR)/include
	mv $(USEARCH_DIR)/src/usearch-$(USEARCH_VERSION)/include $(USEARCH_DIR)/include
	rm -rf $(USEARCH_DIR)/src

# Re-install (and so recompile) only when a build input changed.
$(STAMP): $(PY) $(SOURCES) $(LLAMA_WHEEL) $(USEARCH_HEADERS)
	$(PIP) install --quiet --find-links $(LLAMA_WHEELS) -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# --durations=15: the slowest tests, so the suite's time budget stays in view as it grows
test: install
	$(PY) -m pytest --durations=15 $(PYTEST_ARGS)

# --timeout=0: the tests' per-test limit (pyproject.toml) is not a benchmark's; a benchmark
# runs a fixed number of rounds, however long this machine takes for them
bench: install $(LLAMA_SERVER)
	mkdir -p benchmarks/results
	$(PY) -m pytest benchmarks -q -p no:randomly --benchmark-only --timeout=0 \
		--benchmark-json=benchmarks/results/latest.json $(PYTEST_ARGS)
	$(PY) -m benchmarks.gates benchmarks/results/latest.json

# A mixed, careless workload against one server, then back to baseline (benchmarks/soak.py);
# SOAK_MINUTES=N to change its length. make test runs a bounded one (tests/server/test_soak.py).
SOAK_MINUTES ?= 10
soak: install
	$(VENV)/bin/tryll-fast models fetch --models-dir $(MODELS_DIR) --quiet SmolLM2-135M-Instruct
	$(PY) -m benchmarks.soak --minutes $(SOAK_MINUTES)

# Structure-aware fuzzing of a live server beside a healthy session (fuzz/server.py);
# FUZZ_SERVER_FRAMES=N to change its length. make test runs 40 000 frames of it.
FUZZ_SERVER_FRAMES ?= 500000
fuzz-server: install
	$(PY) -m fuzz.server --frames $(FUZZ_SERVER_FRAMES)

# One connection sends a million mutated frames; peak memory, the queue cap, a healthy
# session's first token during it, and the process back to baseline (benchmarks/flood.py).
flood: install
	$(PY) -m benchmarks.flood

# Only the [fuzz] extra's requirements: `pip install -e .[fuzz]` would recompile.
fuzz: install
	$(PY) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['fuzz'])" | xargs $(PIP) install --quiet
	rm -rf build/fuzz-corpus && $(PY) -m fuzz.corpus --write-corpus build/fuzz-corpus
	$(PY) fuzz/fuzz_codec.py -atheris_runs=$(FUZZ_RUNS) build/fuzz-corpus

gen: $(PY)
	$(PY) tools/gen_codec.py
	$(PY) tools/gen_errors.py
	$(PY) tools/gen_client.py
	$(PY) tools/ship_layout.py

# A build whose Cython frames show up in py-spy / cProfile / coverage.
profile-build: $(PY)
	$(PIP) install --quiet Cython==3.3.1 setuptools==80.9.0 wheel==0.45.1
	TRYLL_CYTHON_TRACE=1 $(PY) setup.py build_ext --inplace
	rm -f $(STAMP)

serve: install
	$(VENV)/bin/tryll-fast models fetch --models-dir $(MODELS_DIR)
	exec $(VENV)/bin/tryll-fast serve --models-dir $(MODELS_DIR) \
		--pipeline-config $(PIPELINE_CONFIG) $(SERVE_ARGS)

clean:
	rm -rf build $(VENV) tryll_fast/*/*.so tryll_fast/*/*.c tryll_fast/*/*.cpp *.egg-info
