"""A BERT sentence encoder (safetensors + tokenizer.json) as a llama.cpp GGUF, written at fetch.

Sentence-transformers models such as all-MiniLM-L6-v2 ship as a Hugging Face BERT checkpoint;
llama.cpp runs BERT (architecture "bert": bidirectional attention, pooled output, no KV
cache) from a GGUF. llama.cpp's own converter needs torch and transformers; this one reads
the safetensors with numpy and writes with the `gguf` package, for exactly the BERT layout
(no RoBERTa position offset, no classifier heads), and refuses anything else by name.

What llama.cpp expects, and why the file looks the way it does:
- Tensors under llama.cpp's names (`_LAYER_TENSORS`); numpy keeps the checkpoint's
  (out, in) layout, which the writer stores as ggml's (in, out). The pooler is dropped:
  sentence embeddings are the mean of the last hidden states, not the pooler output.
- `bert.pooling_type` comes from the sentence-transformers pooling config when there is
  one (all-MiniLM-L6-v2: mean), so a context created with an unspecified pooling type
  pools the way the model was trained.
- The WordPiece vocabulary in llama.cpp's "phantom space" form: its WPM tokenizer prefixes
  every word with U+2581 and then matches the longest vocabulary entry at each position,
  so a word-initial piece `sword` is stored as `\u2581sword` and a continuation `##smith`
  as `smith`. Special tokens ([CLS], [SEP], ...) stay as they are.
- 2-D weight matrices in F16, norms and biases in F32 (F16 measured against F32:
  docs/models.md, "Embedding model: chosen by measurement").
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from tryll_fast.engines.errors import EngineError
from tryll_fast.errors import ErrorCode

__all__ = ["BertConversionError", "convert_bert", "gguf_path_for", "prepare_bert_gguf",
           "read_safetensors", "read_vocabulary"]

PHANTOM_SPACE = "\u2581"
CONTINUATION = "##"
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
                       "I64": np.int64, "I32": np.int32}
# Per layer: checkpoint name under encoder.layer.N. -> llama.cpp's name under blk.N.
_LAYER_TENSORS = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_EMBEDDING_TENSORS = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
# Added to the activations whole, not looked up by row like the word embeddings, so they
# stay F32 in an F16 file (as llama.cpp's converter keeps them).
_ALWAYS_F32 = {"token_types.weight", "position_embd.weight"}
# Checkpoint tensors with no place in an embedding GGUF.
_DROPPED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")
# Where the pooling config may sit beside the weights: the catalog's flat file name, or the
# sentence-transformers directory layout.
_POOLING_CONFIGS = ("pooling_config.json", "1_Pooling/config.json")


class BertConversionError(EngineError, ValueError):
    """The files are not a BERT checkpoint this converter can write (the message says why).
    Raised at fetch, where it fails the download like any preparation step (6001)."""
    code = ErrorCode.DownloadFailed


def gguf_path_for(weights: Path) -> Path:
    """Where the GGUF of a checkpoint's weights file lives: beside it, `<stem>.gguf`."""
    return Path(weights).with_suffix(".gguf")


def prepare_bert_gguf(main_file: Path, progress: Callable[[float], None] | None = None) -> Path:
    """The fetch-time step (`prepare = "bert-gguf"`): the GGUF of `main_file`, a
    model.safetensors with config.json and tokenizer.json beside it."""
    return convert_bert(main_file, gguf_path_for(main_file), progress=progress)


def convert_bert(weights: Path, out: Path, *, f16: bool = True,
                 progress: Callable[[float], None] | None = None) -> Path:
    """Write the GGUF of the BERT checkpoint `weights` (config.json and tokenizer.json
    beside it) to `out`, atomically; returns `out`."""
    try:
        import gguf
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise RuntimeError("converting a BERT model needs the gguf package") from exc
    report = progress or (lambda fraction: None)
    weights, out = Path(weights), Path(out)
    folder = weights.parent
    config = _read_json(folder / "config.json", "the model's config.json")
    if config.get("model_type") != "bert":
        raise BertConversionError(
            f"{folder / 'config.json'}: model_type is {config.get('model_type')!r}, not "
            f"'bert' (architectures {config.get('architectures')})")
    tensors = read_safetensors(weights)
    hp = _hyperparameters(config, tensors, weights.name)
    vocab = read_vocabulary(folder / "tokenizer.json", hp["vocab_size"])
    pooling = _pooling_type(folder, gguf)
    report(0.1)

    tmp = out.with_name(out.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), "bert")
    try:
        writer.add_name(weights.parent.name)  # the catalog entry's directory
        writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16
                             else gguf.LlamaFileType.ALL_F32)
        writer.add_context_length(hp["context_length"])
        writer.add_embedding_length(hp["hidden"])
        writer.add_feed_forward_length(hp["ffn"])
        writer.add_block_count(hp["layers"])
        writer.add_head_count(hp["heads"])
        writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
        writer.add_causal_attention(False)
        writer.add_pooling_type(pooling)

        writer.add_tokenizer_model("bert")
        writer.add_token_list(vocab.tokens)
        writer.add_token_types(vocab.types)
        # Every token of a single sentence is "segment A": llama.cpp adds row 0 of these.
        writer.add_token_type_count(hp["token_types"])
        # llama.cpp's WPM tokenizer opens a text with the bos id and closes it with the
        # sep id: [CLS] ... [SEP], as the model was trained.
        writer.add_bos_token_id(vocab.special["[CLS]"])
        writer.add_sep_token_id(vocab.special["[SEP]"])
        writer.add_unk_token_id(vocab.special["[UNK]"])
        if "[PAD]" in vocab.special:
            writer.add_pad_token_id(vocab.special["[PAD]"])
        if "[MASK]" in vocab.special:
            writer.add_mask_token_id(vocab.special["[MASK]"])
        writer.add_add_bos_token(True)
        # llama.cpp reads these (BertNormalizer's options); gguf 0.19.0 has no helper.
        writer.add_bool("tokenizer.ggml.normalizer.lowercase", vocab.lowercase)
        writer.add_bool("tokenizer.ggml.normalizer.strip_accents", vocab.strip_accents)

        for name, array in _gguf_tensors(tensors, hp["layers"], f16):
            writer.add_tensor(name, array)
        report(0.5)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)  # a half-written GGUF must not look like a result
        raise
    writer.close()
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, out)
    report(1.0)
    return out


# ---- the checkpoint

def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Name -> array (memory-mapped, read-only) of a safetensors file; a clear error for a
    file that is not one."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise BertConversionError(f"{path}: not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n < 2 or 8 + n > size:
            raise BertConversionError(f"{path}: not a safetensors file (header length {n} "
                                      f"in a {size}-byte file)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BertConversionError(f"{path}: not a safetensors file (its header is not "
                                      f"JSON: {exc})") from None
    if not isinstance(header, dict):
        raise BertConversionError(f"{path}: not a safetensors file (header is not a table)")
    out: dict[str, np.ndarray] = {}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if size > 8 + n else None
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = np.dtype(_SAFETENSORS_DTYPES[meta["dtype"]]).newbyteorder("<")
            start, end = meta["data_offsets"]
            shape = tuple(int(d) for d in meta["shape"])
        except (KeyError, TypeError, ValueError):
            raise BertConversionError(f"{path}: tensor {name!r} has an unsupported entry "
                                      f"{meta!r}") from None
        count = int(np.prod(shape, dtype=np.int64))
        if data is None or end - start != count * dtype.itemsize or end > data.size:
            raise BertConversionError(f"{path}: tensor {name!r} lies outside the file")
        out[name] = data[start:end].view(dtype).reshape(shape)
    return out


def _read_json(path: Path, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise BertConversionError(f"{what} is missing: {path}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BertConversionError(f"{path}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BertConversionError(f"{path}: expected a JSON object")
    return value


def _hyperparameters(config: dict, tensors: dict[str, np.ndarray], name: str) -> dict:
    missing = [k for k in _EMBEDDING_TENSORS if _strip(k) not in map(_strip, tensors)]
    if missing:
        raise BertConversionError(f"{name}: not a BERT checkpoint (no {', '.join(missing)}; "
                                  f"it has {len(tensors)} tensors, e.g. "
                                  f"{', '.join(sorted(tensors)[:3]) or 'none'})")
    try:
        hp = {
            "vocab_size": int(config["vocab_size"]),
            "hidden": int(config["hidden_size"]),
            "ffn": int(config["intermediate_size"]),
            "layers": int(config["num_hidden_layers"]),
            "heads": int(config["num_attention_heads"]),
            "context_length": int(config["max_position_embeddings"]),
            "token_types": int(config.get("type_vocab_size", 2)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise BertConversionError(f"config.json: missing or bad BERT field {exc}") from None
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise BertConversionError("config.json: llama.cpp's BERT needs absolute position "
                                  f"embeddings, not {config['position_embedding_type']!r}")
    if config.get("hidden_act", "gelu") != "gelu":
        raise BertConversionError(f"config.json: llama.cpp's BERT runs GELU, not "
                                  f"{config['hidden_act']!r}")
    emb = _get(tensors, "embeddings.word_embeddings.weight")
    if emb.shape != (hp["vocab_size"], hp["hidden"]):
        raise BertConversionError(f"{name}: word embeddings are {emb.shape}, config.json says "
                                  f"({hp['vocab_size']}, {hp['hidden']})")
    if hp["hidden"] % hp["heads"]:
        raise BertConversionError(f"config.json: hidden_size {hp['hidden']} is not a multiple "
                                  f"of num_attention_heads {hp['heads']}")
    return hp


def _strip(name: str) -> str:
    return name[len("bert."):] if name.startswith("bert.") else name


def _get(tensors: dict[str, np.ndarray], name: str) -> np.ndarray:
    for key in (name, "bert." + name):
        if key in tensors:
            return tensors[key]
    raise BertConversionError(f"not a BERT checkpoint: no tensor {name!r}")


def _gguf_tensors(tensors: dict[str, np.ndarray], layers: int,
                  f16: bool) -> Iterator[tuple[str, np.ndarray]]:
    wanted = set(_EMBEDDING_TENSORS)
    for src, dst in _EMBEDDING_TENSORS.items():
        yield dst, _cast(_get(tensors, src), f16 and dst not in _ALWAYS_F32)
    for i in range(layers):
        for src, dst in _LAYER_TENSORS.items():
            for part in ("weight", "bias"):
                name = f"encoder.layer.{i}.{src}.{part}"
                wanted.add(name)
                yield f"blk.{i}.{dst}.{part}", _cast(_get(tensors, name), f16)
    extra = sorted(n for n in map(_strip, tensors)
                   if n not in wanted and not n.startswith(_DROPPED_PREFIXES))
    if extra:
        raise BertConversionError(f"not a plain BERT encoder: unexpected tensors "
                                  f"{', '.join(extra[:5])}")


def _cast(array: np.ndarray, f16: bool) -> np.ndarray:
    # Norms and biases stay F32: llama.cpp adds them to F32 activations (ggml's CPU add
    # takes no F16 operand), and they are a few KiB.
    if f16 and array.ndim == 2:
        return np.ascontiguousarray(array, dtype=np.float16)
    return np.ascontiguousarray(array, dtype=np.float32)


# ---- the tokenizer

@dataclass
class Vocabulary:
    tokens: list[str]           # llama.cpp's phantom-space form, by id
    types: list[int]            # gguf TokenType, by id
    special: dict[str, int]     # "[CLS]" -> id, ...
    lowercase: bool
    strip_accents: bool


def read_vocabulary(path: Path, vocab_size: int) -> Vocabulary:
    """The WordPiece vocabulary of a tokenizer.json, as llama.cpp's WPM tokenizer wants it."""
    import gguf

    tok = _read_json(path, "the model's tokenizer.json")
    model = tok.get("model") or {}
    if model.get("type") != "WordPiece":
        raise BertConversionError(f"{path}: a {model.get('type')!r} tokenizer, not WordPiece")
    if model.get("continuing_subword_prefix", CONTINUATION) != CONTINUATION:
        raise BertConversionError(f"{path}: continuation prefix "
                                  f"{model['continuing_subword_prefix']!r}, not '##'")
    vocab = model.get("vocab") or {}
    if len(vocab) != vocab_size or sorted(vocab.values()) != list(range(vocab_size)):
        raise BertConversionError(f"{path}: {len(vocab)} tokens with ids that do not cover "
                                  f"0..{vocab_size - 1} (config.json's vocab_size)")
    control = {t["content"]: t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens = [""] * vocab_size
    types = [int(gguf.TokenType.NORMAL)] * vocab_size
    for text, i in vocab.items():
        if text in control:
            tokens[i] = text
            types[i] = int(gguf.TokenType.CONTROL)
        elif text.startswith(CONTINUATION) and len(text) > len(CONTINUATION):
            tokens[i] = text[len(CONTINUATION):]
        else:
            tokens[i] = PHANTOM_SPACE + text
    # Two entries with one text would make llama.cpp's text -> id map ambiguous.
    if len(set(tokens)) != len(tokens):
        seen: set[str] = set()
        dup = next(t for t in tokens if t in seen or seen.add(t))
        raise BertConversionError(f"{path}: two vocabulary entries become {dup!r}")
    special = {name: control[name] for name in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]")
               if name in control}
    for name in ("[CLS]", "[SEP]", "[UNK]"):
        if name not in special:
            raise BertConversionError(f"{path}: no special token {name}")
    norm = tok.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        raise BertConversionError(f"{path}: normalizer {norm.get('type')!r}, not "
                                  "BertNormalizer")
    lowercase = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")  # None: follow lowercase (BertNormalizer's rule)
    return Vocabulary(tokens, types, special, lowercase,
                      lowercase if strip is None else bool(strip))


def _pooling_type(folder: Path, gguf):
    for rel in _POOLING_CONFIGS:
        path = folder / rel
        if path.is_file():
            cfg = _read_json(path, "the pooling config")
            if cfg.get("pooling_mode_mean_tokens"):
                return gguf.PoolingType.MEAN
            if cfg.get("pooling_mode_cls_token"):
                return gguf.PoolingType.CLS
            raise BertConversionError(f"{path}: a pooling mode llama.cpp's BERT does not run "
                                      f"({cfg})")
    return gguf.PoolingType.MEAN  # a sentence encoder without a config: mean, like s-t
