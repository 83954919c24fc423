"""LoRA adapters and context overrides as engine lanes, with the real SmolLM2 and adapters
written for it at test time (engines/llama/lora_gguf.py)."""
import os

import pytest

from engine_prompts import chatml
from tryll_fast.engines.llama import InvalidRequest, LlamaEngine
from tryll_fast.engines.errors import ModelLoadError
from tryll_fast.engines.llama.context import LlamaContext
from tryll_fast.engines.llama.lanes import LaneKey
from tryll_fast.engines.llama.lora_gguf import write_lora

pytestmark = pytest.mark.model

PROMPTS = [chatml(q) for q in ("Describe your tavern.", "Who are you?",
                               "What is for dinner?", "Tell me a secret.")]


@pytest.fixture(scope="module")
def adapters(smollm2, tmp_path_factory):
    """Two adapters for SmolLM2 and one for another architecture."""
    d = tmp_path_factory.mktemp("lora")
    return {"a": write_lora(smollm2, d / "a.gguf", seed=1, magnitude=0.1),
            "b": write_lora(smollm2, d / "b.gguf", seed=2, magnitude=0.1),
            "gpt2": write_lora(smollm2, d / "gpt2.gguf", seed=3, architecture="gpt2"),
            "dir": str(d)}


@pytest.fixture
def engine(smollm2_model, tmp_path):
    eng = LlamaEngine(smollm2_model, n_ctx=1024, n_slots=4, n_prefix_slots=1, n_batch=64,
                      spill_dir=tmp_path / "kv")
    yield eng
    eng.close()


def run(engine, lane, prompts, max_tokens=16):
    with engine.hold():
        handles = [engine.submit(p, max_tokens=max_tokens, lane=lane) for p in prompts]
    return [h.result(120) for h in handles]


def test_scale_zero_is_the_base_lane(adapters):
    key = LaneKey.make([(adapters["a"], 0.0)])
    assert key == LaneKey() and key.is_base


def test_an_adapter_at_scale_zero_in_a_context_changes_nothing(smollm2_model, adapters):
    """Below the lane key: llama.cpp itself given the adapter at scale 0."""
    adapter = smollm2_model.acquire_adapter(adapters["a"])
    try:
        tokens = smollm2_model.tokenize(PROMPTS[0])
        out = []
        for applied in ((), ((adapter, 0.0),), ((adapter, 1.0),), ((adapter, 0.5),)):
            with LlamaContext(smollm2_model, n_ctx=256, n_seq_max=1, n_batch=64) as ctx:
                ctx.set_adapters(applied)
                [index] = ctx.decode([(0, tokens, True)])
                out.append(ctx.logits(index))
        assert (out[0] == out[1]).all()
        assert not (out[0] == out[2]).all()
        # half the scale, a delta between none and all of it
        d_half, d_full = abs(out[3] - out[0]).mean(), abs(out[2] - out[0]).mean()
        assert 0 < d_half < d_full
    finally:
        smollm2_model.release_adapter(adapter)


def test_scale_one_differs_and_is_loaded_once(engine, smollm2_model, adapters):
    base = run(engine, None, PROMPTS[:1])
    a1 = engine.open_lane(LaneKey.make([(adapters["a"], 1.0)]))
    a_half = engine.open_lane(LaneKey.make([(adapters["a"], 0.5)]))
    try:
        assert smollm2_model.adapters == {os.path.realpath(adapters["a"]): 2}
        with_a = run(engine, a1, PROMPTS[:1])
        assert with_a != base
        assert run(engine, a_half, PROMPTS[:1])[0].strip()
        assert run(engine, None, PROMPTS[:1]) == base      # the base lane is untouched
        lanes = {d["lane"]: d for d in engine.lanes()}
        assert set(lanes) == {"base", "a.gguf@1", "a.gguf@0.5"}
        assert lanes["a.gguf@1"]["users"] == 1
    finally:
        engine.close_lane(a1)
        engine.close_lane(a_half)
    assert smollm2_model.adapters == {}
    assert [d["lane"] for d in engine.lanes()] == ["base"]


def test_two_adapter_sets_batched_produce_what_they_produce_alone(engine, adapters):
    ka = engine.open_lane(LaneKey.make([(adapters["a"], 1.0)]))
    kb = engine.open_lane(LaneKey.make([(adapters["b"], 1.0)]))
    alone_a = run(engine, ka, PROMPTS)
    alone_b = run(engine, kb, PROMPTS)
    assert alone_a != alone_b
    with engine.hold():
        ha = [engine.submit(p, max_tokens=16, lane=ka) for p in PROMPTS]
        hb = [engine.submit(p, max_tokens=16, lane=kb) for p in PROMPTS]
    assert [h.result(120) for h in ha] == alone_a
    assert [h.result(120) for h in hb] == alone_b
    status = engine.status()["lanes"]
    assert status["a.gguf@1"]["steps"] > 0 and status["b.gguf@1"]["steps"] > 0
    engine.close_lane(ka)
    engine.close_lane(kb)


def test_a_conversation_moved_to_another_adapter_is_decoded_again(engine, adapters):
    ka = engine.open_lane(LaneKey.make([(adapters["a"], 1.0)]))
    key = ("npc", "dialog")
    first = engine.submit(PROMPTS[0], key=key, max_tokens=8)
    first.result(60)
    longer = PROMPTS[0] + first.text + "<|im_end|>\n" + chatml("And then?").lstrip()
    again = engine.submit(longer, key=key, max_tokens=8)      # same lane: the suffix only
    again.result(60)
    assert again.stats.prefilled_tokens < again.stats.prompt_tokens
    moved = engine.submit(longer + again.text, key=key, max_tokens=8, lane=ka)
    moved.result(60)
    assert moved.stats.prefilled_tokens == moved.stats.prompt_tokens
    assert engine.conversation(key)["lane"] == "a.gguf@1"
    back = engine.submit(longer + again.text + moved.text, key=key, max_tokens=8)
    back.result(60)
    assert back.stats.prefilled_tokens == back.stats.prompt_tokens
    assert engine.conversation(key)["lane"] == "base"
    engine.close_lane(ka)


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_kv_lanes_run_and_hold_fewer_bytes(engine, kv_type):
    key = engine.open_lane(LaneKey.make(kv_type=kv_type))
    try:
        text = run(engine, key, PROMPTS[:2])
        assert all(t.strip() for t in text)
        mem = engine.memory()
        [lane] = mem["lanes"]
        assert lane["lane"]["kv_type"] == kv_type
        assert lane["context"]["kv_bytes_per_cell"] < mem["context"]["kv_bytes_per_cell"] / 1.8
    finally:
        engine.close_lane(key)


def test_overrides_reach_the_context(engine):
    key = engine.open_lane(LaneKey.make(n_batch=32, n_ubatch=16, n_threads=1, flash_attn=0))
    [lane] = [d for d in engine.lanes() if d["lane"] != "base"]
    assert (lane["n_batch"], lane["n_ubatch"], lane["n_threads"], lane["flash_attn"]) == \
        (32, 16, 1, 0)
    assert run(engine, key, PROMPTS[:1])[0].strip()
    engine.close_lane(key)


def test_a_quantized_cache_without_flash_attention_is_refused(engine):
    with pytest.raises(InvalidRequest, match="q8_0 KV cache needs flash attention"):
        engine.open_lane(LaneKey.make(kv_type="q8_0", flash_attn=0))


@pytest.mark.parametrize("name, match", [
    ("gpt2", "for architecture 'gpt2', the model is 'llama'"),
    ("missing", "is not a file"),
    ("text", "is not a GGUF file"),
    ("model", "not a LoRA adapter"),
])
def test_files_that_are_not_an_adapter_for_the_model(engine, smollm2, smollm2_model,
                                                     adapters, name, match):
    path = {"gpt2": adapters["gpt2"], "missing": os.path.join(adapters["dir"], "none.gguf"),
            "model": smollm2}.get(name)
    if name == "text":
        path = os.path.join(adapters["dir"], "notes.gguf")
        with open(path, "w") as f:
            f.write("not a gguf")
    with pytest.raises(ModelLoadError, match=match):
        engine.open_lane(LaneKey.make([(path, 1.0)]))
    assert [d["lane"] for d in engine.lanes()] == ["base"]
    assert smollm2_model.adapters == {}


def test_wrong_tensor_shapes_are_refused_by_llama_cpp(engine, smollm2_model, adapters,
                                                      tmp_path):
    """An adapter whose metadata matches but whose tensors do not: llama.cpp's own check."""
    import gguf
    import numpy as np
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", 8.0)
    w.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((8, 100), np.float32))
    w.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((576, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="llama.cpp refused its tensors"):
        engine.open_lane(LaneKey.make([(path, 1.0)]))
    assert smollm2_model.adapters == {}


def test_lane_keys_are_validated():
    with pytest.raises(InvalidRequest, match="listed twice"):
        LaneKey.make([("x.gguf", 1.0), ("./x.gguf", 0.5)])
    with pytest.raises(InvalidRequest, match="not a finite number"):
        LaneKey.make([("x.gguf", float("nan"))])
    with pytest.raises(InvalidRequest, match="kv_type='q5'"):
        LaneKey.make(kv_type="q5")
    with pytest.raises(InvalidRequest, match="n_threads=-1"):
        LaneKey.make(n_threads=-1)


def test_submit_to_a_lane_that_is_not_open(engine, adapters):
    with pytest.raises(InvalidRequest, match="is not open"):
        engine.submit(PROMPTS[0], max_tokens=4, lane=LaneKey.make([(adapters["a"], 1.0)]))
