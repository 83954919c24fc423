"""Gemma 3 270M (base model, sliding-window layers): the same engine, a second architecture."""
import pytest

from tryll_fast.engines.llama import LlamaEngine

pytestmark = pytest.mark.model


def test_gemma_completion_reuse_and_restore(gemma, tmp_path):
    with LlamaEngine(gemma, n_ctx=512, n_slots=2, n_prefix_slots=1, n_batch=64,
                     spill_dir=tmp_path) as eng:
        prompt = eng.tokenize("The Eiffel Tower is located in the city of")
        h = eng.submit(prompt, key="g", max_tokens=4)
        assert "Paris" in h.result(120)
        # a different continuation rolls the KV tail back (swa_full keeps that exact)
        p2 = prompt + eng.tokenize(" Rome. Monday, Tuesday, Wednesday,", add_special=False)
        h2 = eng.submit(p2, key="g", max_tokens=4)
        assert "Thursday" in h2.result(120)
        assert h2.stats.cached_tokens == len(prompt)
        assert h2.stats.prefilled_tokens == len(p2) - len(prompt)
        eng.evict("g")
        h3 = eng.submit(p2, key="g", max_tokens=4)
        h3.result(120)
        assert h3.stats.restored and h3.stats.prefilled_tokens == 1
        mem = eng.memory()
        assert mem["model"]["architecture"] == "gemma3"
        assert mem["context"]["kv_cells_used"] == len(p2) + 3
