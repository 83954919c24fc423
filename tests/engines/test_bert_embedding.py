"""all-MiniLM-L6-v2 through llama.cpp: the GGUF written at fetch (bert_gguf.py) against a
numpy BERT forward pass over the original safetensors, and a WordPiece tokenizer read from
tokenizer.json, both written here from the model's definition, sharing no code with the
converter (the weights are read with the gguf package's own safetensors reader)."""
from __future__ import annotations

import json
import math
import struct
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from tryll_fast.engines.llama.bert_gguf import BertConversionError, convert_bert
from tryll_fast.engines.llama.embeddings import Embedder

MINILM = "all-MiniLM-L6-v2"
SENTENCES = [
    "The blacksmith of Ashcombe forges ploughshares and horseshoes.",
    "Where can I buy a sword?",
    "Ysolde Varrowen lends rare books only in exchange for another one!",
    "Hi",
    "Un café, s'il vous plaît: naïve façade (accents are stripped).",
    "Quillemarch's gates close at sunset; pay the gatekeeper 1 silver coin.",
]


# ---- the reference: WordPiece from tokenizer.json, BERT in numpy

class WordPiece:
    """BERT's basic tokenizer (clean, lowercase, strip accents, split punctuation) and
    greedy longest-match WordPiece, as tokenizer.json describes them."""

    def __init__(self, path: Path) -> None:
        tok = json.loads(Path(path).read_text(encoding="utf-8"))
        self.vocab = tok["model"]["vocab"]
        self.unk = tok["model"]["unk_token"]
        self.prefix = tok["model"]["continuing_subword_prefix"]
        self.max_chars = tok["model"]["max_input_chars_per_word"]
        assert tok["normalizer"]["lowercase"]

    @staticmethod
    def _is_punct(ch: str) -> bool:
        cp = ord(ch)
        if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
            return True
        return unicodedata.category(ch).startswith("P")

    @staticmethod
    def _clean(ch: str) -> str:
        if ord(ch) in (0, 0xFFFD):
            return ""
        if ch in "\t\n\r" or unicodedata.category(ch) == "Zs":
            return " "
        return "" if unicodedata.category(ch).startswith("C") else ch

    def words(self, text: str) -> list[str]:
        # BertNormalizer: clean, strip accents (NFD, drop marks), then lowercase
        text = unicodedata.normalize("NFD", "".join(map(self._clean, text)))
        text = "".join(c for c in text if unicodedata.category(c) != "Mn").lower()
        out: list[str] = []
        for chunk in text.split():
            word = ""
            for ch in chunk:
                if self._is_punct(ch):
                    if word:
                        out.append(word)
                    out.append(ch)
                    word = ""
                else:
                    word += ch
            if word:
                out.append(word)
        return out

    def encode(self, text: str) -> list[int]:
        ids = [self.vocab["[CLS]"]]
        for word in self.words(text):
            if len(word) > self.max_chars:
                ids.append(self.vocab[self.unk])
                continue
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                    if piece in self.vocab:
                        break
                    end -= 1
                if end == start:
                    pieces = [self.vocab[self.unk]]
                    break
                pieces.append(self.vocab[piece])
                start = end
            ids.extend(pieces)
        ids.append(self.vocab["[SEP]"])
        return ids


class ReferenceBert:
    def __init__(self, folder: Path) -> None:
        from gguf.utility import SafetensorsLocal

        cfg = json.loads((folder / "config.json").read_text())
        self.layers, self.heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]
        with SafetensorsLocal(folder / "model.safetensors") as tensors:
            self.w = {name: t.mmap_bytes().view(np.float32).reshape(t.shape).astype(np.float64)
                      for name, t in tensors.items() if t.dtype == "F32"}
        self._erf = np.vectorize(math.erf)

    def _ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embed(self, ids: list[int]) -> np.ndarray:
        w, n = self.w, len(ids)
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self._ln(x, "embeddings.LayerNorm")
        d = x.shape[1] // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (self._dense(x, p + f"attention.self.{m}").reshape(n, self.heads, d)
                       .transpose(1, 0, 2) for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            ctx = (scores / scores.sum(-1, keepdims=True)) @ v
            ctx = ctx.transpose(1, 0, 2).reshape(n, -1)
            x = self._ln(x + self._dense(ctx, p + "attention.output.dense"),
                         p + "attention.output.LayerNorm")
            h = self._dense(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + self._erf(h / math.sqrt(2.0)))  # BERT's exact GELU
            x = self._ln(x + self._dense(h, p + "output.dense"), p + "output.LayerNorm")
        v = x.mean(0)  # sentence-transformers' mean pooling (every token is unmasked)
        return v / np.linalg.norm(v)


# ---- fixtures

@pytest.fixture(scope="module")
def minilm_path(model_file) -> Path:
    return Path(model_file(MINILM))


@pytest.fixture(scope="module")
def minilm(minilm_path):
    e = Embedder(minilm_path, n_batch=256, n_seq_max=16, max_tokens=128)
    yield e
    e.close()


# ---- the model

@pytest.mark.model
def test_gguf_layout(minilm_path):
    import gguf

    path = minilm_path.with_suffix(".gguf")
    reader = gguf.GGUFReader(str(path))
    kv = {k: f.contents() for k, f in reader.fields.items()
          if not k.startswith("tokenizer.ggml.token")}
    assert kv["general.architecture"] == "bert"
    assert (kv["bert.context_length"], kv["bert.embedding_length"],
            kv["bert.feed_forward_length"], kv["bert.block_count"],
            kv["bert.attention.head_count"]) == (512, 384, 1536, 6, 12)
    assert kv["bert.attention.causal"] is False
    assert kv["bert.pooling_type"] == int(gguf.PoolingType.MEAN)
    assert kv["tokenizer.ggml.model"] == "bert"
    assert (kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.seperator_token_id"],
            kv["tokenizer.ggml.unknown_token_id"], kv["tokenizer.ggml.padding_token_id"],
            kv["tokenizer.ggml.mask_token_id"]) == (101, 102, 100, 0, 103)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = json.loads((minilm_path.parent / "tokenizer.json").read_text())["model"]["vocab"]
    # phantom-space form: a word start gets U+2581, a ## continuation loses its ##
    assert tokens[vocab["[CLS]"]] == "[CLS]"
    assert tokens[vocab["sword"]] == "\u2581sword"
    assert tokens[vocab["##smith"]] == "smith"
    names = {t.name: t for t in reader.tensors}
    assert len(names) == 5 + 6 * 16
    for n in ("token_embd.weight", "token_types.weight", "position_embd.weight",
              "token_embd_norm.weight", "token_embd_norm.bias", "blk.5.attn_q.weight",
              "blk.5.attn_k.bias", "blk.5.attn_v.weight", "blk.5.attn_output.bias",
              "blk.5.attn_output_norm.weight", "blk.5.ffn_up.weight", "blk.5.ffn_down.bias",
              "blk.5.layer_output_norm.bias"):
        assert n in names, n
    assert names["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert names["blk.0.ffn_up.bias"].tensor_type == gguf.GGMLQuantizationType.F32
    assert not any(n.startswith(("pooler", "cls")) for n in names)


@pytest.mark.model
def test_tokens_match_tokenizer_json(minilm, minilm_path):
    ref = WordPiece(minilm_path.parent / "tokenizer.json")
    for text in SENTENCES:
        assert minilm.tokenize(text) == ref.encode(text), text


@pytest.mark.model
def test_embeddings_match_a_numpy_bert(minilm, minilm_path):
    ref = ReferenceBert(minilm_path.parent)
    got = minilm.embed(SENTENCES)  # one decode: every sentence in the same batch
    assert got.shape == (len(SENTENCES), 384)
    cos = []
    for text, vec in zip(SENTENCES, got):
        cos.append(float(ref.embed(minilm.tokenize(text)) @ vec))
    print(f"\ncosine to the numpy BERT: {np.round(cos, 5)}")
    assert min(cos) >= 0.99


@pytest.mark.model
def test_paraphrase_ranks_above_unrelated(minilm):
    query = "Who can repair my broken plough?"
    docs = ["Garrick the blacksmith mends farm tools and forges ploughshares.",
            "The library of Quillemarch holds maps of every road.",
            "Brenna cooks a famous mutton stew at the inn.",
            "Wolves hunt sheep in the fields during hard winters."]
    q = minilm.embed_one(query)
    scores = minilm.embed(docs) @ q
    assert int(np.argmax(scores)) == 0
    assert scores[0] > scores[1:].max() + 0.1


@pytest.mark.model
def test_truncation_keeps_the_closing_sep(minilm_path):
    e = Embedder(minilm_path, n_batch=64, max_tokens=16)
    try:
        toks = e.tokenize("word " * 40)
        assert len(toks) == 16 and toks[0] == 101 and toks[-1] == 102
        assert e.pooling == "mean"
        assert e.embed(["word " * 40]).shape == (1, 384)
    finally:
        e.close()


# ---- refusals (no model needed)

BERT_CONFIG = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 8,
               "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
               "num_attention_heads": 2, "max_position_embeddings": 16}


def _safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, at = {}, [], 0
    for name, arr in tensors.items():
        data = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def test_refuses_a_file_that_is_not_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BERT_CONFIG))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"GGUF" + bytes(4) + b"\x00" * 100)  # e.g. a GGUF renamed
    with pytest.raises(BertConversionError, match="not a safetensors file"):
        convert_bert(weights, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()


def test_refuses_safetensors_that_are_not_bert(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BERT_CONFIG))
    weights = tmp_path / "model.safetensors"
    _safetensors(weights, {"model.layers.0.self_attn.q_proj.weight": np.zeros((4, 4))})
    with pytest.raises(BertConversionError,
                       match=r"not a BERT checkpoint \(no embeddings.word_embeddings"):
        convert_bert(weights, tmp_path / "model.gguf")
    (tmp_path / "config.json").write_text(json.dumps(dict(BERT_CONFIG, model_type="llama")))
    with pytest.raises(BertConversionError, match="model_type is 'llama', not 'bert'"):
        convert_bert(weights, tmp_path / "model.gguf")
    assert not list(tmp_path.glob("*.gguf*"))
