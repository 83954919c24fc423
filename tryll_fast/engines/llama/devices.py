"""Where a model's layers go: the GPU devices llama.cpp's build offers, and the placement
rule (docs/configuration.md, "GPU builds and placement").

A CPU build offers no device, so every placement resolves to host memory. A Vulkan or CUDA
build offers its GPUs through ggml's device registry; llama.cpp's Vulkan backend lists only
discrete and integrated GPUs unless GGML_VK_VISIBLE_DEVICES names others (the software
device lavapipe, which the tests use, is one of those others).

- "ram": no device at all, not even for large matrix products (llama.cpp would otherwise
  borrow the GPU for a long prompt's matrices with every layer in host memory).
- "vram": every layer (or `n_gpu_layers` of them) on the first GPU. With no GPU, or less
  free device memory than the weights need, it falls back to "ram" and says why.
- "auto": "vram" when a GPU's free memory holds the weights with room to spare
  (AUTO_HEADROOM: the game shares the card), else "ram".
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from tryll_fast.engines.llama.backend import init_backend

PLACEMENTS = ("auto", "ram", "vram")
# auto offloads only when the weights take at most this share of the device's free memory:
# the rest is the KV cache's and the game's.
AUTO_HEADROOM = 0.5
# ggml_backend_dev_type
_GPU, _IGPU = 1, 2


@dataclass(frozen=True)
class Device:
    index: int          # in ggml's registry
    name: str           # "Vulkan0", "CUDA0"
    description: str    # "llvmpipe (LLVM 15.0.6, 256 bits)"
    integrated: bool
    free_bytes: int
    total_bytes: int
    handle: int         # ggml_backend_dev_t


@dataclass(frozen=True)
class Placement:
    device: Device | None   # None: host memory only
    n_gpu_layers: int       # as llama.cpp takes it (-1 = all layers and the output)
    note: str               # why a hint was not honoured ('' when it was)

    @property
    def name(self) -> str:
        return "ram" if self.device is None else "vram"


_lib = None


def _ggml():
    global _lib
    if _lib is None:
        from llama_cpp._ggml import libggml as lib
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_char_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_memory.argtypes = [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
        lib.ggml_backend_dev_memory.restype = None
        lib.ggml_backend_reg_count.restype = ctypes.c_size_t
        lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_reg_get.restype = ctypes.c_void_p
        lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_reg_name.restype = ctypes.c_char_p
        _lib = lib
    return _lib


def backends() -> list[str]:
    """The backends this llama.cpp build registered ("CPU", "Vulkan", "CUDA"...), whether
    or not they found a device."""
    init_backend()
    lib = _ggml()
    return [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
            for i in range(lib.ggml_backend_reg_count())]


def gpus() -> list[Device]:
    """The GPU devices of this build, with their free and total memory now."""
    init_backend()
    lib = _ggml()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = lib.ggml_backend_dev_type(dev)
        if kind not in (_GPU, _IGPU):
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        found.append(Device(i, lib.ggml_backend_dev_name(dev).decode(),
                            (lib.ggml_backend_dev_description(dev) or b"").decode(),
                            kind == _IGPU, free.value, total.value, dev))
    return found


def choose(placement: str, weights_bytes: int, n_gpu_layers: int | None = None) -> Placement:
    """The placement a model of `weights_bytes` gets for a hint; n_gpu_layers (None = all)
    limits how many layers a "vram" or "auto" placement offloads."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} is not one of {', '.join(PLACEMENTS)}")
    if placement == "ram" or n_gpu_layers == 0:
        return HOST
    layers = -1 if n_gpu_layers is None else n_gpu_layers
    devices = gpus()
    if not devices:
        note = "" if placement == "auto" else "no GPU device in this build or machine"
        return Placement(None, 0, note)
    dev = devices[0]
    free = dev.free_bytes or dev.total_bytes
    if placement == "vram":
        if free and weights_bytes > free:
            return Placement(None, 0, f"{dev.name} has {free} bytes free, the weights need "
                                      f"{weights_bytes}")
        return Placement(dev, layers, "")
    if free and weights_bytes <= free * AUTO_HEADROOM:
        return Placement(dev, layers, "")
    return HOST


HOST = Placement(None, 0, "")


def apply(model_params, where: Placement):
    """Set llama_model_params for `where`: its layer count and a NULL-terminated device
    list, empty for host memory (NULL would let llama.cpp use every GPU). Returns the list,
    which must stay alive until llama_model_load_from_file returns."""
    model_params.n_gpu_layers = where.n_gpu_layers
    listed = (ctypes.c_void_p * 2)(where.device.handle if where.device is not None else None,
                                   None)
    model_params.devices = ctypes.addressof(listed)
    return listed


def keep_on_host(context_params) -> None:
    """A context of a host-placed model in a GPU build: no KV cache and no large matrix
    product on the device."""
    context_params.offload_kqv = False
    context_params.op_offload = False


def device_layers(n_layer: int, n_gpu_layers: int) -> range:
    """llama.cpp's split for one device: the layer indices it offloads, where index n_layer
    is the output layer (it goes first; the input embeddings never go)."""
    ngl = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    return range(n_layer + 1 - ngl, n_layer + 1)


def device_weight_bytes(path: str, n_layer: int, n_gpu_layers: int) -> int:
    """Bytes of the GGUF's tensors that llama.cpp places on the device for n_gpu_layers.
    A model that ties its output to the input embeddings gets a device copy of them."""
    from gguf import GGUFReader
    on = device_layers(n_layer, n_gpu_layers)
    if not on:
        return 0
    reader = GGUFReader(path)
    total = 0
    embd = 0
    has_output = False
    for t in reader.tensors:
        name = t.name
        if name.startswith("blk."):
            if int(name.split(".", 2)[1]) in on:
                total += int(t.n_bytes)
        elif name.startswith("output"):
            has_output = has_output or name == "output.weight"
            if n_layer in on:
                total += int(t.n_bytes)
        elif name == "token_embd.weight":
            embd = int(t.n_bytes)
    if n_layer in on and not has_output:
        total += embd
    return total
