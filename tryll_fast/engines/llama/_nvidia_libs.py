"""The CUDA runtime and cuBLAS of a CUDA build, loaded before llama.cpp.

A CUDA build of llama.cpp (`make install LLAMA_BACKEND=cuda`, docs/configuration.md "GPU
builds and placement") links libcudart and libcublas by soname. A player's machine has them
only as NVIDIA's PyPI wheels, which the install puts in the venv under
site-packages/nvidia/cu<major>/lib; llama-cpp-python's libraries carry an rpath of $ORIGIN
alone, so the dynamic linker would not look there. Loading them first, globally, makes the
linker resolve libggml-cuda's needs to the copies already in the process.

Nothing is loaded unless the installed llama.cpp has a CUDA backend: a CPU or Vulkan venv
that happens to hold NVIDIA wheels (another package's) does not map 700 MB of cuBLAS.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sysconfig

__all__ = ["preload"]

# cublasLt before cublas, which needs it
_ORDER = ("libcudart.so.*", "libcublasLt.so.*", "libcublas.so.*")


def _llama_lib_dir() -> str | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def preload() -> list[str]:
    """Load the NVIDIA wheels' runtime libraries if llama.cpp was built with CUDA; returns
    the paths loaded (none on other builds, or where the libraries come from the system)."""
    lib = _llama_lib_dir()
    if lib is None or not glob.glob(os.path.join(lib, "libggml-cuda.so*")):
        return []
    loaded = []
    for d in sorted(glob.glob(os.path.join(sysconfig.get_paths()["purelib"],
                                           "nvidia", "cu*", "lib"))):
        for pattern in _ORDER:
            for path in sorted(glob.glob(os.path.join(d, pattern))):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                loaded.append(path)
    return loaded
