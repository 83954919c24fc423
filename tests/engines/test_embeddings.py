"""Pooled embeddings through a dedicated llama.cpp context."""

import numpy as np
import pytest

from tryll_fast.engines.llama.embeddings import Embedder, EmbeddingError

SMOL = "SmolLM2-135M-Instruct"
GEMMA = "Gemma-3-270M"
DIMS = {SMOL: 576, GEMMA: 640}

pytestmark = pytest.mark.model


@pytest.fixture(scope="module", params=[SMOL, GEMMA])
def embedder(request):
    e = Embedder(request.getfixturevalue("model_file")(request.param), n_batch=64, max_tokens=32, n_seq_max=4)
    e.model_name = request.param
    yield e
    e.close()


RELATED = [
    ("The cat sat on the mat.", "A kitten is sitting on the rug."),
    ("How do I forge a steel sword?", "What is the process for making a blade from iron?"),
    ("The king was murdered in his castle.", "Someone killed the monarch inside the fortress."),
]
UNRELATED = [
    ("The cat sat on the mat.", "Interest rates rose sharply this quarter."),
    ("How do I forge a steel sword?", "The recipe needs two cups of sugar."),
    ("The king was murdered in his castle.", "Photosynthesis turns light into energy."),
]


def test_dimension_dtype_and_normalisation(embedder):
    assert embedder.dim == DIMS[embedder.model_name]
    v = embedder.embed(["Hello there.", "A much longer sentence about dragons and gold."])
    assert v.shape == (2, embedder.dim) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    one = embedder.embed_one("Hello there.")
    assert one.shape == (embedder.dim,)


def test_related_pairs_score_higher_than_unrelated(embedder):
    texts = [t for pair in RELATED + UNRELATED for t in pair]
    v = embedder.embed(texts)  # one decode for all twelve texts
    cos = [float(v[i] @ v[i + 1]) for i in range(0, len(texts), 2)]
    related, unrelated = cos[:len(RELATED)], cos[len(RELATED):]
    print(f"\n{embedder.model_name}: related {np.round(related, 3)} "
          f"unrelated {np.round(unrelated, 3)}")
    assert np.mean(related) > np.mean(unrelated) + 0.1
    for r, u in zip(related, unrelated):  # same anchor sentence
        assert r > u


@pytest.fixture(scope="module")
def smol_embedder(request):
    e = Embedder(request.getfixturevalue("model_file")(SMOL), n_batch=32, max_tokens=24, n_seq_max=4)
    yield e
    e.close()


def test_batched_matches_one_at_a_time(smol_embedder):
    embedder = smol_embedder
    texts = ["The blacksmith sells swords and shields to travellers.",
             "Rain falls on the village.", "Hi", "The dragon sleeps under the mountain.",
             "Bread costs two coins at the market today."]
    # Grouped by the token budget (32) and by n_seq_max (4): three decodes.
    batched = embedder.embed(texts)
    single = np.stack([embedder.embed_one(t) for t in texts])
    # Not bit-identical across batch shapes (llama.cpp), but the same vector.
    assert np.all(np.sum(batched * single, axis=1) > 0.999)


def test_batches_split_by_sequence_and_token_limits(smol_embedder):
    embedder = smol_embedder
    texts = [f"Item {i} is a key." for i in range(embedder.n_seq_max + 1)]
    texts.append("word " * 100)  # truncated to max_tokens
    v = embedder.embed(texts)
    assert v.shape == (len(texts), embedder.dim)
    assert len(embedder.tokenize(texts[-1])) == embedder.max_tokens
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_errors_and_close(request):
    with pytest.raises(EmbeddingError, match="not found"):
        Embedder("/nonexistent/model.gguf")
    e = Embedder(request.getfixturevalue("model_file")(SMOL), max_tokens=32)
    with pytest.raises(TypeError):
        e.embed("not a list")
    e.close()
    e.close()  # idempotent
    assert e.closed
    with pytest.raises(EmbeddingError, match="closed"):
        e.embed(["x"])
