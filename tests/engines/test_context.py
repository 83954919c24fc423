"""The guarded model/context layer: misuse raises EngineError instead of aborting."""
import pytest

from tryll_fast.engines.llama import (
    EngineClosed, EngineError, InvalidRequest, LlamaContext, LlamaModel, ModelLoadError,
    SamplerChain, SamplingParams,
)


@pytest.fixture
def ctx(smollm2_model):
    c = LlamaContext(smollm2_model, n_ctx=256, n_seq_max=4, n_batch=32)
    yield c
    c.close()


@pytest.mark.model
def test_model_facts_and_tokenizer_round_trip(smollm2_model):
    m = smollm2_model
    assert m.weights_bytes > 50e6 and m.n_vocab > 1000
    assert m.kv_bytes_per_cell > 0
    text = "Hello, naïve world! 😀"
    toks = m.tokenize(text, add_special=False)
    assert m.detokenize(toks) == text
    assert b"".join(m.token_to_piece(t) for t in toks).decode() == text
    im_start = m.tokenize("<|im_start|>", add_special=False)
    assert len(im_start) == 1  # parsed as the control token


def test_missing_model_file_raises(tmp_path):
    with pytest.raises(ModelLoadError):
        LlamaModel(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError):
        LlamaModel(bad)


@pytest.mark.model
def test_decode_keeps_mirror_equal_to_llama(ctx, smollm2_model):
    toks = smollm2_model.tokenize("The quick brown fox", add_special=False)
    idx = ctx.decode([(0, toks, True), (2, toks[:2], True)])
    assert idx == [len(toks) - 1, len(toks) + 1]
    assert ctx.next_pos(0) == len(toks) == ctx.seq_pos_max(0) + 1
    assert ctx.next_pos(2) == 2 == ctx.seq_pos_max(2) + 1
    chain = SamplerChain(smollm2_model, SamplingParams())
    try:
        assert 0 <= ctx.sample(chain.handle, idx[0]) < smollm2_model.n_vocab
    finally:
        chain.free()
    ctx.seq_rm(0, 2)
    assert ctx.next_pos(0) == 2 == ctx.seq_pos_max(0) + 1
    ctx.seq_cp(2, 1, 2)
    assert ctx.seq_pos_max(1) == 1


@pytest.mark.model
@pytest.mark.parametrize("seq", [-1, 4, 1000])
def test_seq_id_out_of_range(ctx, seq):
    with pytest.raises(InvalidRequest, match="n_seq_max=4"):
        ctx.decode([(seq, [1, 2], True)])
    with pytest.raises(InvalidRequest):
        ctx.seq_rm(seq)
    with pytest.raises(InvalidRequest):
        ctx.state_seq_get(seq)
    with pytest.raises(InvalidRequest):
        ctx.seq_cp(0, seq, 1)


@pytest.mark.model
def test_batch_larger_than_n_batch(ctx):
    with pytest.raises(InvalidRequest, match="exceeds n_batch=32"):
        ctx.decode([(0, [1] * 20, False), (1, [1] * 13, True)])


@pytest.mark.model
def test_empty_batch_and_bad_tokens(ctx, smollm2_model):
    with pytest.raises(InvalidRequest, match="empty"):
        ctx.decode([(0, [], True)])
    with pytest.raises(InvalidRequest, match="vocabulary"):
        ctx.decode([(0, [smollm2_model.n_vocab], True)])
    with pytest.raises(InvalidRequest, match="vocabulary"):
        ctx.decode([(0, [-5], True)])


@pytest.mark.model
def test_positions_must_continue_the_sequence(ctx):
    ctx.decode_raw([1, 2], [0, 1], [0, 0], [0, 1])
    with pytest.raises(InvalidRequest, match="expected 2"):
        ctx.decode_raw([3], [5], [0], [1])
    with pytest.raises(InvalidRequest, match="expected 0"):
        ctx.decode_raw([3], [1], [1], [1])
    ctx.decode_raw([3, 4], [2, 3], [0, 0], [0, 1])
    assert ctx.seq_pos_max(0) == 3


@pytest.mark.model
def test_sequence_longer_than_context(smollm2_model):
    with LlamaContext(smollm2_model, n_ctx=64, n_seq_max=1, n_batch=256) as c:
        n = c.n_ctx_seq  # llama.cpp pads small contexts up (to 256)
        while c.next_pos(0) < n:  # exactly fill the cells
            c.decode([(0, [1] * min(c.n_batch, n - c.next_pos(0)), False)])
        with pytest.raises(InvalidRequest, match=f"beyond n_ctx={n}"):
            c.decode([(0, [1], False)])


@pytest.mark.model
def test_sampling_an_index_without_logits(ctx, smollm2_model):
    chain = SamplerChain(smollm2_model, SamplingParams(temperature=0))
    try:
        with pytest.raises(InvalidRequest, match="no logits"):
            ctx.sample(chain.handle, 0)  # nothing decoded yet
        ctx.decode([(0, [1, 2, 3], True)])
        with pytest.raises(InvalidRequest, match="no logits"):
            ctx.sample(chain.handle, 1)
        # the index that has logits samples from them: greedy picks their maximum
        assert ctx.sample(chain.handle, 2) == int(ctx.logits(2).argmax())
    finally:
        chain.free()


@pytest.mark.model
def test_removing_one_sequence_keeps_the_others_logits(ctx, smollm2_model):
    # the scheduler frees finished sequences between the samples of one step
    idx = ctx.decode([(0, [1, 2], True), (1, [3, 4], True)])
    before = ctx.logits(idx[1])
    ctx.seq_rm(0)
    assert ctx.seq_pos_max(0) == -1 and ctx.seq_pos_max(1) == 1
    assert (ctx.logits(idx[1]) == before).all()
    chain = SamplerChain(smollm2_model, SamplingParams(temperature=0))
    try:
        assert ctx.sample(chain.handle, idx[1]) == int(before.argmax())
    finally:
        chain.free()


@pytest.mark.model
def test_partial_copy_needs_unified_kv(smollm2_model):
    c = LlamaContext(smollm2_model, n_ctx=256, n_seq_max=2, n_batch=32, kv_unified=False)
    try:
        c.decode([(0, [1, 2, 3, 4], False)])
        with pytest.raises(InvalidRequest, match="kv_unified"):
            c.seq_cp(0, 1, 2)
        c.seq_cp(0, 1, 4)  # a whole-sequence copy is fine
        assert c.seq_pos_max(1) == 3
    finally:
        c.close()


@pytest.mark.model
def test_copy_and_restore_targets_must_be_empty(ctx):
    ctx.decode([(0, [1, 2, 3], False), (1, [5], False)])
    with pytest.raises(InvalidRequest, match="not empty"):
        ctx.seq_cp(0, 1, 2)
    with pytest.raises(InvalidRequest, match="holds 3"):
        ctx.seq_cp(0, 2, 4)
    blob = ctx.state_seq_get(0)
    with pytest.raises(InvalidRequest, match="not empty"):
        ctx.state_seq_set(1, blob)
    assert ctx.state_seq_set(3, blob) == 3


@pytest.mark.model
def test_use_after_close(smollm2):
    m = LlamaModel(smollm2)
    c = LlamaContext(m, n_ctx=64, n_seq_max=1, n_batch=8)
    with pytest.raises(InvalidRequest, match="open context"):
        m.close()  # the weights stay while a context uses them
    c.close()
    c.close()  # idempotent
    with pytest.raises(EngineClosed):
        c.decode([(0, [1], True)])
    with pytest.raises(EngineClosed):
        c.state_seq_get(0)
    m.close()
    with pytest.raises(EngineClosed):
        m.tokenize("hi")
    with pytest.raises(EngineClosed):
        m.detokenize([1])
    with pytest.raises(EngineError):
        SamplerChain(m, SamplingParams())
    with pytest.raises(EngineClosed):
        LlamaContext(m, n_ctx=64)


@pytest.mark.model
def test_bad_context_parameters(smollm2_model):
    with pytest.raises(InvalidRequest, match="n_seq_max"):
        LlamaContext(smollm2_model, n_seq_max=0)
    with pytest.raises(InvalidRequest, match="n_seq_max"):
        LlamaContext(smollm2_model, n_seq_max=257)
    with pytest.raises(InvalidRequest, match="n_batch"):
        LlamaContext(smollm2_model, n_batch=0)


@pytest.mark.model
def test_bad_grammar_is_refused(smollm2_model):
    with pytest.raises(InvalidRequest, match="grammar"):
        SamplerChain(smollm2_model, SamplingParams(grammar="root ::= (unclosed"))
    with pytest.raises(InvalidRequest, match="grammar"):
        SamplerChain(smollm2_model, SamplingParams(grammar='other ::= "x"'))


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_kv_bytes_per_cell_matches_llama_state(request, name):
    """The accounting's bytes per cell equal what llama.cpp serialises per token."""
    with LlamaModel(request.getfixturevalue(name)) as m, \
            LlamaContext(m, n_ctx=256, n_seq_max=2, n_batch=64) as c:
        c.decode([(0, list(range(10, 42)), False)])
        c.decode([(1, list(range(10, 26)), False)])
        per_token = (len(c.state_seq_get(0)) - len(c.state_seq_get(1))) / 16
        # plus 12 bytes of cell metadata (pos, seq count, seq id) per KV cache
        # (Gemma 3 has two: full and sliding-window layers)
        assert per_token - m.kv_bytes_per_cell in (12, 24)
