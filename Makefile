# tryll_fast developer entry points. Everything runs inside .venv (Python 3.11).
#   make test    install (builds the Cython extensions), run the tests, list the slowest
#   make test-gpu  the Vulkan build on a software device: placement and a part of the engine
#   make test-cuda  the CUDA build: the same tests, on an NVIDIA device or the CPU fallback
#   LLAMA_BACKEND=vulkan|cuda  (with install/serve/test) a GPU build of llama.cpp; cpu default
#   make bench   run the benchmarks, then the gates (exits non-zero on a FAIL)
#   make llama-server  build the peer benchmark's llama-server once (make bench needs it)
#   make bench-backends / make bench-share  the 8-NPC workload per build / a game beside it
#   make bench-cpu-share  a synthetic busy game beside the server (benchmarks/cpu_share.py)
#   make eval    the NPC quality suite on each language model (docs/npc-quality.md)
#   make fuzz    a longer atheris campaign on the codec
#   make fuzz-server  mutated frames of every request type against a live server
#   make soak / make flood  a careless workload / a million-frame flood, back to baseline
#   make gen     regenerate checked-in code from schema/
#   make serve   install, fetch the default models, serve on 127.0.0.1:9100 (TCP) and
#                127.0.0.1:9101 (the pipeline: WebSocket /pipeline, Socket.IO, the example agents)

PYTHON ?= python3.11
LLAMA_BACKEND ?= cpu
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(LLAMA_BACKEND)
SOURCES := setup.py pyproject.toml $(wildcard csrc/*.h csrc/*.hpp) \
           $(wildcard tryll_fast/*/*.pyx tryll_fast/*/*.pxi tryll_fast/*/*.pxd tryll_fast/*/*/*.pyx)
FUZZ_RUNS ?= 2000000
# make serve: where models are fetched (shared with the tests' build/models) and extra flags
MODELS_DIR ?= build/models
SERVE_ARGS ?=
# make serve LLM=Qwen2.5-Coder-1.5B-Instruct: another catalog language model for the
# characters (fetched, then `--llm`); empty = the catalog's default one
LLM ?=
# make serve: the pipeline transport's agents (ws://127.0.0.1:9101/pipeline?agent=innkeeper)
PIPELINE_CONFIG ?= tryll_fast/gateway/example.toml
# make serve: the source checkout's server settings (a ToolCall pause that nobody resumes
# ends after 2 s, so a contributor notices the missing resume; the released server waits)
SERVE_CONFIG ?= data/server-config.json
PYTEST_ARGS ?=

# llama-cpp-python compiles llama.cpp with -march=native. On a CPU that advertises AMX this
# builds AMX tile kernels, and on the VMs here they fault (GPF on LDTILECFG) at the first
# decode, so AMX is compiled out (-mno-* wins over -march=native in GCC). pip's own wheel
# cache ignores CMAKE_ARGS, so the wheel is built once into a cache of ours, named after the
# version and the flags, and installed from there: compiled from source once per machine.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CFLAGS := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
# LLAMA_BACKEND=vulkan or cuda builds llama.cpp with that GPU backend as well, into a wheel
# cache entry of its own (docs/configuration.md, "GPU builds"); cpu is the default. The
# venv remembers which one it holds (STAMP), so switching reinstalls the matching wheel.
# the NVIDIA GPUs nvidia-smi lists (empty without one); `=`, so it runs only when used
NVIDIA_GPUS = $(shell nvidia-smi -L 2>/dev/null)
ifeq ($(LLAMA_BACKEND),cpu)
LLAMA_BACKEND_FLAGS :=
else ifeq ($(LLAMA_BACKEND),vulkan)
LLAMA_BACKEND_FLAGS := -DGGML_VULKAN=on
else ifeq ($(LLAMA_BACKEND),cuda)
# nvcc from a system toolkit (CUDA_HOME). A toolkit of major version 13 may come without
# cuBLAS, and a player's machine has neither it nor the CUDA runtime: both come from
# NVIDIA's PyPI wheels, installed into the venv before the build, linked against, and
# loaded from there at run time (tryll_fast/engines/llama/_nvidia_libs.py). No VMM: the
# build then needs no libcuda.so to link, and loads where no NVIDIA driver is (llama.cpp
# finds no CUDA device and runs on the CPU). CUDA_ARCHITECTURES: the GPUs of this machine
# when nvidia-smi lists one, else PTX for Turing and newer plus RTX 30 and 40 code.
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCHITECTURES ?= $(if $(NVIDIA_GPUS),native,75-virtual;86-real;89-real)
NVIDIA_WHEELS := nvidia-cuda-runtime==13.5.37 nvidia-cublas==13.10.0.20
NVIDIA_LIB := $(VENV)/lib/python3.11/site-packages/nvidia/cu13
LLAMA_BACKEND_FLAGS := -DGGML_CUDA=on -DGGML_CUDA_NO_VMM=ON \
	-DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHITECTURES) \
	-DCUDA_cublas_LIBRARY=$(abspath $(NVIDIA_LIB))/lib/libcublas.so.13 \
	-DCUDA_cublasLt_LIBRARY=$(abspath $(NVIDIA_LIB))/lib/libcublasLt.so.13 \
	-DCMAKE_CUDA_FLAGS=-I$(abspath $(NVIDIA_LIB))/include
else
$(error LLAMA_BACKEND must be cpu, vulkan or cuda, not '$(LLAMA_BACKEND)')
endif
LLAMA_WHEELS ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tryll_fast/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)-noamx$(if $(LLAMA_BACKEND_FLAGS),-$(LLAMA_BACKEND))
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

.PHONY: test test-gpu test-cuda bench bench-backends bench-share bench-cpu-share eval soak flood fuzz fuzz-server gen serve install clean profile-build llama-server

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

ifeq ($(LLAMA_BACKEND),cpu)
$(LLAMA_WHEEL): | $(PY)
	mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS='-DCMAKE_C_FLAGS="$(LLAMA_CFLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CFLAGS)"' \
		$(PIP) wheel --quiet --no-deps --no-binary llama-cpp-python --no-cache-dir \
		-w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@
else
# A GPU backend builds from the unpacked sdist, so that tools/llama_vulkan_compat.py can
# adapt it to Debian 12's Vulkan headers first (a no-op with newer headers).
$(LLAMA_WHEEL): | $(PY)
	rm -rf $(LLAMA_WHEELS)/src && mkdir -p $(LLAMA_WHEELS)/src
	$(PIP) download --quiet --no-deps --no-binary llama-cpp-python --no-cache-dir \
		-d $(LLAMA_WHEELS)/src llama-cpp-python==$(LLAMA_CPP_VERSION)
	tar -xzf $(LLAMA_WHEELS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_WHEELS)/src
	$(if $(filter vulkan,$(LLAMA_BACKEND)),$(PY) tools/llama_vulkan_compat.py \
		$(LLAMA_WHEELS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION))
	$(if $(NVIDIA_WHEELS),$(PIP) install --quiet $(NVIDIA_WHEELS))
	CMAKE_ARGS='$(LLAMA_BACKEND_FLAGS) -DCMAKE_C_FLAGS="$(LLAMA_CFLAGS)" -DCMAKE_CXX_FLAGS="$(LLAMA_CFLAGS)"' \
		CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(PIP) wheel --quiet --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
		$(LLAMA_WHEELS)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)
	rm -rf $(LLAMA_WHEELS)/src
	touch $@
endif

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

# Re-install (and so recompile) only when a build input changed. The llama-cpp-python
# wheel is reinstalled from this backend's cache entry every time: each backend's wheel
# has the same name and version, so pip alone would keep whichever one it found first.
$(STAMP): $(PY) $(SOURCES) $(LLAMA_WHEEL) $(USEARCH_HEADERS)
	rm -f $(VENV)/.installed*
	$(PIP) install --quiet --force-reinstall --no-deps --no-index --find-links $(LLAMA_WHEELS) \
		llama-cpp-python==$(LLAMA_CPP_VERSION)
	$(if $(NVIDIA_WHEELS),$(PIP) install --quiet $(NVIDIA_WHEELS))
	$(PIP) install --quiet --find-links $(LLAMA_WHEELS) -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# --durations=15: the slowest tests, so the suite's time budget stays in view as it grows
test: install
	$(PY) -m pytest --durations=15 $(PYTEST_ARGS)

# The Vulkan build, in a venv of its own, on llama.cpp's software Vulkan device (lavapipe,
# Debian's mesa-vulkan-drivers): the placement tests, then a bounded part of the engine and
# server suites with every language model on the device (TRYLL_LLAMA_PLACEMENT=vram).
# lavapipe is slow, so the part is chosen by GPU_TESTS. .ci/run runs it after make test.
GPU_VENV ?= .venv-vulkan
GPU_TESTS ?= tests/engines/test_gpu.py \
	tests/engines/test_engine.py::test_coherent_greedy_answer \
	tests/engines/test_engine.py::test_second_turn_decodes_only_the_new_suffix \
	tests/engines/test_engine.py::test_shared_prefix_is_stored_once_for_eight_agents \
	tests/engines/test_engine.py::test_evict_restore_continues_like_the_unbroken_run \
	tests/engines/test_engine.py::test_throttle_pauses_between_steps_and_keeps_the_text \
	tests/server/test_model_messages.py::test_load_pin_memory_unload
test-gpu:
	$(MAKE) install VENV=$(GPU_VENV) LLAMA_BACKEND=vulkan
	GGML_VK_VISIBLE_DEVICES=0 TRYLL_LLAMA_PLACEMENT=vram \
		$(GPU_VENV)/bin/python -m pytest -p no:randomly --durations=10 $(GPU_TESTS)

# The CUDA build, in a venv of its own: the same tests as test-gpu. With an NVIDIA device
# every language model goes on it; without one the build loads anyway (no VMM, the runtime
# and cuBLAS from the venv) and the tests check that it falls back to the CPU. Not in
# .ci/run: the build takes about 30 minutes on 2 cores for one architecture.
CUDA_VENV ?= .venv-cuda
test-cuda:
	$(MAKE) install VENV=$(CUDA_VENV) LLAMA_BACKEND=cuda
	TRYLL_LLAMA_PLACEMENT=$(if $(NVIDIA_GPUS),vram,auto) \
		$(CUDA_VENV)/bin/python -m pytest -p no:randomly --durations=10 $(GPU_TESTS)

# The 8-NPC workload's tokens/s on the CPU build and on the Vulkan build (reported, not
# gated: here the Vulkan device is lavapipe). Needs make test-gpu's venv for the second.
bench-backends: install
	$(PY) -m benchmarks.backends

# A game's frames on the device beside the NPCs, alone and at several throttles, on each
# build (reported, not gated; benchmarks/share.py). On lavapipe pass fewer, shorter turns:
# make bench-share SHARE_ARGS="--builds vulkan --npcs 2 --npc-tokens 8 --seconds 60"
SHARE_ARGS ?=
bench-share: install
	$(PY) -m benchmarks.share $(SHARE_ARGS)

# a synthetic game beside the server: make bench-cpu-share CPU_SHARE_ARGS="--voice"
bench-cpu-share: install
	$(PY) -m benchmarks.cpu_share $(CPU_SHARE_ARGS)

# --timeout=0: the tests' per-test limit (pyproject.toml) is not a benchmark's; a benchmark
# runs a fixed number of rounds, however long this machine takes for them
bench: install $(LLAMA_SERVER)
	mkdir -p benchmarks/results
	$(PY) -m pytest benchmarks -q -p no:randomly --benchmark-only --timeout=0 \
		--benchmark-json=benchmarks/results/latest.json $(PYTEST_ARGS)
	$(PY) -m benchmarks.gates benchmarks/results/latest.json

# The NPC quality suite (benchmarks/npc/): every case on every catalog language model, scored
# with intervals, into benchmarks/results/npc_quality.json and docs/npc-quality.md. About an
# hour on 2 cores for the three models; EVAL_ARGS="--models NAME" for one.
EVAL_MODELS := SmolLM2-135M-Instruct Qwen2.5-Coder-0.5B-Instruct Qwen2.5-Coder-1.5B-Instruct \
	all-MiniLM-L6-v2
EVAL_ARGS ?=
eval: install
	$(VENV)/bin/tryll-fast models fetch --models-dir $(MODELS_DIR) --quiet $(EVAL_MODELS)
	$(PY) -m benchmarks.npc $(EVAL_ARGS)

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
# session's first token during it against as many turns with no flood, and the process back
# to baseline (benchmarks/flood.py). Refused frames cost ten of the frame budget, so at the
# defaults the flood takes about 14 minutes and the control as long.
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
	$(VENV)/bin/tryll-fast models fetch --models-dir $(MODELS_DIR) $(if $(LLM),&& \
		$(VENV)/bin/tryll-fast models fetch --models-dir $(MODELS_DIR) $(LLM))
	exec $(VENV)/bin/tryll-fast serve --models-dir $(MODELS_DIR) --config $(SERVE_CONFIG) \
		--pipeline-config $(PIPELINE_CONFIG) $(if $(LLM),--llm $(LLM)) $(SERVE_ARGS)

clean:
	rm -rf build $(VENV) $(GPU_VENV) $(CUDA_VENV) tryll_fast/*/*.so tryll_fast/*/*.c tryll_fast/*/*.cpp *.egg-info
