"""Placement of a model's layers: the rule on every build, and on a GPU build the layers,
weights and KV cache where llama.cpp itself says they are (docs/configuration.md, "GPU
builds and placement").

`make test-gpu` runs this file (and a bounded part of the engine suite) with the Vulkan
build on the software device lavapipe; on the CPU build the `gpu` tests skip, saying why.
"""
import re

import pytest

from tryll_fast.engines.llama import LlamaEngine, LlamaModel, _nvidia_libs, devices
from tryll_fast.engines.llama.backend import init_backend

from engine_prompts import chatml

GPUS = devices.gpus()
needs_gpu = pytest.mark.skipif(
    not GPUS, reason="no GPU device in this llama.cpp build or machine (make test-gpu runs "
                     "these on the Vulkan build with lavapipe)")


CUDA_BUILD = "CUDA" in devices.backends()


@pytest.mark.skipif(not CUDA_BUILD, reason="not a CUDA build (make install LLAMA_BACKEND=cuda)")
def test_a_cuda_build_runs_on_the_venvs_nvidia_libraries():
    # loaded before llama_cpp by the package; loading them again finds the same files
    loaded = _nvidia_libs.preload()
    assert [p.rsplit("/", 1)[1] for p in loaded] == [
        "libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13"]
    with open("/proc/self/maps") as f:
        maps = f.read()
    for path in loaded:                     # the copies in the venv, not a system toolkit's
        assert path in maps, path


@pytest.mark.skipif(CUDA_BUILD, reason="a CUDA build loads them")
def test_other_builds_load_no_nvidia_library():
    assert _nvidia_libs.preload() == []
    with open("/proc/self/maps") as f:
        assert "libcublas" not in f.read()


def test_device_layers_follow_llamacpps_split():
    # llama.cpp offloads the output layer first (index n_layer), then the last layers
    assert list(devices.device_layers(30, 0)) == []
    assert list(devices.device_layers(30, 1)) == [30]
    assert list(devices.device_layers(30, 5)) == [26, 27, 28, 29, 30]
    assert list(devices.device_layers(30, -1)) == list(range(31))
    assert list(devices.device_layers(30, 99)) == list(range(31))


def test_unknown_placements_are_refused(smollm2):
    with pytest.raises(ValueError, match="not one of auto, ram, vram"):
        devices.choose("gpu", 1)
    from tryll_fast.engines.llama import InvalidRequest
    with pytest.raises(InvalidRequest, match="placement 'gpu'"):
        LlamaModel(smollm2, placement="gpu")
    with pytest.raises(InvalidRequest, match="n_gpu_layers=-2"):
        LlamaModel(smollm2, n_gpu_layers=-2)


def test_ram_placement_never_offers_a_device(smollm2):
    with LlamaModel(smollm2, placement="ram") as model:
        info = model.placement_info()
        assert (info["placement"], info["device"], info["device_weights_bytes"]) == ("ram", "", 0)
        assert info["note"] == ""


@pytest.mark.skipif(bool(GPUS), reason="this build has a GPU device")
def test_vram_without_a_device_falls_back_and_says_why(smollm2):
    with LlamaModel(smollm2, placement="vram") as model:
        assert model.placement.name == "ram"
        assert "no GPU device" in model.placement.note
    with LlamaModel(smollm2, placement="auto") as model:
        assert model.placement.name == "ram" and model.placement.note == ""


def _buffers(text: str) -> dict[str, float]:
    """llama.cpp's own log of the buffers it allocated: name -> MiB."""
    out: dict[str, float] = {}
    for name, mib in re.findall(r"(\S+) model buffer size =\s*([\d.]+) MiB", text):
        out[name] = out.get(name, 0.0) + float(mib)
    return out


def _load_logged(capfd, path, **kw):
    import logging
    log = logging.getLogger("llama-cpp-python")
    init_backend()
    old = log.level
    log.setLevel(logging.INFO)
    try:
        capfd.readouterr()
        model = LlamaModel(path, **kw)
        return model, _buffers(capfd.readouterr().err)
    finally:
        log.setLevel(old)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("layers", [-1, 5])
def test_device_weights_are_what_llamacpp_allocated(smollm2, capfd, layers):
    model, buffers = _load_logged(capfd, smollm2, placement="vram", n_gpu_layers=layers)
    with model:
        dev = model.placement.device
        assert model.placement.name == "vram" and model.device_name == dev.name
        assert dev.name in buffers, buffers
        # llama.cpp prints MiB with two decimals
        assert model.device_weights_bytes / 2**20 == pytest.approx(buffers[dev.name], abs=0.02)
        want = 1.0 if layers < 0 else 4 / model.n_layer     # 5 = the output and 4 layers
        assert model.device_layer_share == pytest.approx(want)


@pytest.mark.gpu
@needs_gpu
def test_ram_placement_in_a_gpu_build_allocates_nothing_on_the_device(smollm2, capfd):
    model, buffers = _load_logged(capfd, smollm2, placement="ram")
    with model:
        assert set(buffers) <= {"CPU", "CPU_Mapped", "CPU_REPACK"}, buffers
        assert model.placement_info()["device_weights_bytes"] == 0


@pytest.mark.gpu
@pytest.mark.model
@needs_gpu
def test_eight_conversations_decode_together_on_the_device(smollm2, tmp_path):
    prompts = [chatml(f"Name one colour. Answer {i}.") for i in range(8)]
    with LlamaEngine(smollm2, n_ctx=1024, n_slots=8, n_batch=256, placement="vram",
                     spill_dir=tmp_path / "kv") as eng:
        assert eng.model.placement.name == "vram"
        handles = [eng.submit(p, max_tokens=4, key=f"npc{i}") for i, p in enumerate(prompts)]
        texts = [h.result(timeout=600) for h in handles]
        status = eng.status()
    assert all(t.strip() for t in texts), texts
    # one conversation per step would take >= 8 x 4 steps: they were batched on the device
    assert status["steps"] < 8 * 4 / 2, status
