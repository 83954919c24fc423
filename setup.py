"""Build the Cython extensions.

Set TRYLL_CYTHON_TRACE=1 to compile with Cython `profile` + `linetrace`
(and CYTHON_TRACE_NOGIL), so py-spy, cProfile and coverage see Cython frames:

    TRYLL_CYTHON_TRACE=1 pip install -e . --no-build-isolation
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

TRACE = os.environ.get("TRYLL_CYTHON_TRACE", "") not in ("", "0")
USEARCH_INCLUDE = os.environ.get("TRYLL_USEARCH_INCLUDE", "")
if not os.path.isfile(os.path.join(USEARCH_INCLUDE, "usearch", "index_dense.hpp")):
    raise SystemExit("TRYLL_USEARCH_INCLUDE must name the include/ directory of the usearch "
                     "sdist (`make install` fetches it)")

directives = {
    "language_level": "3",
    "boundscheck": False,      # every buffer index is checked by hand in C
    "wraparound": False,
    "embedsignature": True,
}
macros = []
# No DWARF in normal builds: the generated module is ~500k lines of C, and
# debug info costs a third of its compile time and 30 MB of .so. py-spy needs
# only the symbol table. The trace build keeps -g for native profilers.
cflags = ["-O2", "-Wno-unused-function", "-g" if TRACE else "-g0"]
if TRACE:
    directives.update(profile=True, linetrace=True)
    macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]

extensions = [
    Extension(
        "tryll_fast.codec._codec",
        ["tryll_fast/codec/_codec.pyx"],
        include_dirs=["csrc"],
        define_macros=macros,
        extra_compile_args=cflags,
        depends=["csrc/tf_codec.h", "csrc/tf_pcm.h"] + [
            os.path.join("tryll_fast/codec", f)
            for f in os.listdir("tryll_fast/codec") if f.endswith((".pxi", ".pxd"))
        ],
    ),
    # The epoll reactor: sockets, frame extraction, outbound queues (GIL released in epoll_wait).
    Extension(
        "tryll_fast.transport._reactor",
        ["tryll_fast/transport/_reactor.pyx"],
        include_dirs=["csrc"],
        define_macros=macros,
        extra_compile_args=cflags,
        depends=["csrc/tf_codec.h", "tryll_fast/transport/system.pxd",
                 "tryll_fast/transport/_reactor.pxd",
                 "tryll_fast/transport/connection.pxi", "tryll_fast/transport/reactor.pxi"],
    ),
    # Token streaming: engine text chunks -> AnswerText frames -> the connection.
    Extension(
        "tryll_fast.workflow._stream",
        ["tryll_fast/workflow/_stream.pyx"],
        include_dirs=["csrc"],
        depends=["tryll_fast/codec/_codec.pxd", "tryll_fast/transport/_reactor.pxd"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
    # Speech output: a voice's phoneme durations -> viseme cues.
    Extension(
        "tryll_fast.engines.speech._timeline",
        ["tryll_fast/engines/speech/_timeline.pyx"],
        include_dirs=["csrc"],
        depends=["csrc/tf_pcm.h"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
    # Voice input: AudioBuffer PCM -> 16 kHz float ring (convert, downmix, resample).
    Extension(
        "tryll_fast.voice_input._audio",
        ["tryll_fast/voice_input/_audio.pyx"],
        include_dirs=["csrc"],
        depends=["csrc/tf_audio.h"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
    # The knowledge stores' vector index: USearch's header-only HNSW with a filtered search
    # (csrc/tf_vindex.hpp). The headers come from the pinned usearch sdist (the Makefile
    # fetches it; TRYLL_USEARCH_INCLUDE names its include/ directory). Float reductions
    # may be reordered so the cosine loop vectorises on baseline x86-64 (SSE2).
    Extension(
        "tryll_fast.knowledge._vindex",
        ["tryll_fast/knowledge/_vindex.pyx"],
        include_dirs=["csrc", USEARCH_INCLUDE],
        depends=["csrc/tf_vindex.hpp"],
        language="c++",
        define_macros=macros + [("USEARCH_USE_NUMKONG", "0"), ("USEARCH_USE_OPENMP", "0")],
        extra_compile_args=[f for f in cflags if f != "-O2"] + [
            "-O3", "-std=c++17", "-fassociative-math", "-fno-signed-zeros",
            "-fno-trapping-math", "-Wno-unused-variable"],
    ),
    # A pipeline connection's outbound queue: a put() per streamed token, from the engine's
    # thread, and the pump's coalescing read (gateway/connection.py).
    Extension(
        "tryll_fast.gateway._outbox",
        ["tryll_fast/gateway/_outbox.pyx"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
    # The engine's token -> text hot path (UTF-8 assembly, stop-string hold-back).
    Extension(
        "tryll_fast.engines.llama._detok",
        ["tryll_fast/engines/llama/_detok.pyx"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
    # the low-priority compute thread (no Python on it) and llama_decode's abort callback
    Extension(
        "tryll_fast.engines.llama._lowthread",
        ["tryll_fast/engines/llama/_lowthread.pyx"],
        define_macros=macros,
        extra_compile_args=cflags,
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=directives,
        # a traced build must not reuse an untraced .c file (and vice versa)
        force=TRACE,
        build_dir="build/cython-trace" if TRACE else None,
    ),
)
