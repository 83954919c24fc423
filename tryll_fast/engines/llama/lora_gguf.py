"""LoRA adapter GGUF files: the check a file must pass before llama.cpp loads it as an
adapter for a model (check_lora_file), and a seeded one written for any model
(write_lora).

No LoRA adapter ships on PyPI, and training one needs torch; this writes an untrained one
with the exact layout llama.cpp's adapter loader checks, so the adapter path (loading,
per-context application, KV keyed by the adapter set) can be exercised and measured on any
model. The deltas are random: an adapter changes what the model says, not how well.

What llama.cpp expects (llama-adapter.cpp of the pinned version):
- metadata `general.type = "adapter"`, `adapter.type = "lora"`, `adapter.lora.alpha`
  (the delta is scaled by alpha / rank, then by the scale the context applies), and
  `general.architecture` equal to the model's, else the file is refused;
- for a base weight `W` named `blk.N.attn_q.weight` of ggml shape (n_in, n_out), the pair
  `blk.N.attn_q.weight.lora_a` of shape (n_in, rank) and `.lora_b` of shape (rank, n_out)
  (numpy arrays are written in reverse order: (rank, n_in) and (n_out, rank)).
"""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from tryll_fast.engines.errors import ModelLoadError

__all__ = ["DEFAULT_TARGETS", "check_lora_file", "write_lora"]

# The attention projections: the usual LoRA targets, present in every llama-like model.
DEFAULT_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output")


def write_lora(model_path: str | os.PathLike, out_path: str | os.PathLike, *, rank: int = 8,
               seed: int = 0, magnitude: float = 0.05,
               targets: Iterable[str] = DEFAULT_TARGETS, architecture: str | None = None,
               alpha: float | None = None) -> str:
    """Write a LoRA adapter for the GGUF model at `model_path` to `out_path`; returns it.

    rank: the adapters' inner dimension. magnitude: the standard deviation of A and B's
    values (seeded by `seed`). targets: the base tensors (`blk.N.<target>.weight`) that get
    a pair. architecture: the adapter's `general.architecture` (default the model's; any
    other value makes a file llama.cpp refuses for this model). alpha: default = rank, so
    the delta is A·B times the applied scale."""
    import gguf

    if rank < 1:
        raise ValueError(f"rank={rank} must be >= 1")
    reader = gguf.GGUFReader(os.fspath(model_path))
    model_arch = _text(reader, "general.architecture")
    if model_arch is None:
        raise ValueError(f"{model_path}: no general.architecture in the model's metadata")
    targets = tuple(targets)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(os.fspath(out_path), architecture or model_arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank if alpha is None else alpha))
    pairs = 0
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight" \
                or parts[2] not in targets:
            continue
        n_in, n_out = (int(x) for x in t.shape[:2])
        a = rng.normal(0.0, magnitude, (rank, n_in)).astype(np.float32)
        b = rng.normal(0.0, magnitude, (n_out, rank)).astype(np.float32)
        writer.add_tensor(t.name + ".lora_a", a)
        writer.add_tensor(t.name + ".lora_b", b)
        pairs += 1
    if not pairs:
        raise ValueError(f"{model_path}: no tensor matches the targets {targets}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return os.fspath(out_path)


def check_lora_file(path: str, architecture: str) -> None:
    """Refuse, naming the reason, a file llama.cpp would refuse as a LoRA adapter for a model
    of `architecture` (llama.cpp only logs why and returns NULL)."""
    import gguf

    name = os.path.basename(path)
    if not os.path.isfile(path):
        raise ModelLoadError(f"LoRA adapter {name!r} is not a file")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:
        raise ModelLoadError(f"{name!r} is not a GGUF file: {exc}") from None
    kinds = _text(reader, "general.type"), _text(reader, "adapter.type")
    if kinds != ("adapter", "lora"):
        raise ModelLoadError(f"{name!r} is a GGUF file but not a LoRA adapter "
                             f"(general.type={kinds[0]!r}, adapter.type={kinds[1]!r})")
    arch = _text(reader, "general.architecture")
    if arch != architecture:
        raise ModelLoadError(f"LoRA adapter {name!r} is for architecture {arch!r}, the model "
                             f"is {architecture!r}")


def _text(reader, key: str) -> str | None:
    """A string metadata value of a GGUFReader, None when absent or not a string."""
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    try:
        return bytes(field.parts[field.data[0]]).decode()
    except (UnicodeDecodeError, IndexError, TypeError):
        return None
