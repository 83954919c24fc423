"""Context shift: a prompt that leaves out a stretch of its conversation (the dialog's oldest
turns left the window) keeps the KV of what follows the stretch, moved down, and decodes
only what is new; with context_shift off it decodes again from the cut."""
import random

import pytest

from tryll_fast.engines.llama import LlamaEngine
from tryll_fast.engines.llama.scheduler import CUT_MIN_KEEP, common_prefix_len, find_cut

SYSTEM = "<|im_start|>system\nYou are Brenna, the baker of Oakvale.<|im_end|>\n"


def test_find_cut_finds_where_the_old_tokens_continue_the_prompt():
    head, gone, kept = list(range(10)), list(range(100, 130)), list(range(200, 240))
    old = head + gone + kept + [7, 7, 7]                 # the last reply's tail differs
    new = head + kept + [9, 9]
    assert find_cut(old, new, 10) == (40, 40)
    # nothing cut: the prompt goes on where the conversation stops
    assert find_cut(head + kept, head + kept + [1], 10 + 40) == (0, 0)
    # too short to be worth a shift, or nothing lines up again
    assert find_cut(head + gone + kept[:CUT_MIN_KEEP], head + kept[:CUT_MIN_KEEP - 1], 10) \
        == (0, 0)
    assert find_cut(old, head + list(range(500, 560)), 10) == (0, 0)


def test_find_cut_takes_the_longest_run_when_the_dialog_repeats_itself():
    head = [1, 2, 3]
    turn = list(range(50, 70))                           # a turn said twice
    old = head + turn + [5] * 20 + turn + list(range(300, 330))
    new = head + turn + list(range(300, 330)) + [8]
    # the first copy lines up for 20 tokens, the second for 50: the second is taken
    assert find_cut(old, new, 3) == (3 + 20 + 20, 50)


def test_common_prefix_len_agrees_with_a_plain_loop():
    rng = random.Random(7)

    def plain(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    for _ in range(5000):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 60))]
        b = a[:rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 5))]
        assert common_prefix_len(a, b) == plain(a, b) == common_prefix_len(b, a)


@pytest.fixture(params=[True, False], ids=["shift", "no-shift"])
def engine(request, smollm2_model, tmp_path):
    eng = LlamaEngine(smollm2_model, n_ctx=2048, n_slots=2, n_batch=256,
                      spill_dir=tmp_path / "kv", context_shift=request.param)
    yield eng
    eng.close()


def _turn(user: str, reply: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{reply}<|im_end|>\n"


def _ask(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def _kv(engine, key) -> tuple[int, int]:
    """(tokens the conversation says it holds, llama.cpp's own count for its sequence)."""
    def run():
        conv = engine._sched.slots.get(key)
        return len(conv.tokens), engine.ctx.seq_pos_max(conv.seq_id) + 1
    return engine._call(run, 30)


@pytest.mark.model
def test_turns_leaving_the_window_keep_the_kv_of_the_turns_that_stay(engine):
    key = ("npc", "dialog")
    old_turns = [_turn(f"Tell me about the {t}.", f"The {t} of Oakvale is a fine sight, "
                       "and everyone in the village knows it well.")
                 for t in ("mill", "river", "bridge", "orchard")]
    stay = [_turn("What do you sell?", "Bread, pies and cakes, fresh every morning."),
            _turn("Where is the inn?", "Across the square, next to the old well.")]
    first = engine.tokenize(SYSTEM + "".join(old_turns + stay) + _ask("Good day!"))
    h = engine.submit(first, key=key, max_tokens=8)
    h.result(60)
    # the next prompt drops the four oldest turns: the system prompt, then what stays
    head = engine.tokenize(SYSTEM)
    gone = len(engine.tokenize(SYSTEM + "".join(old_turns))) - len(head)
    question = _ask("What is the capital of France? Answer in one word.")
    second = engine.tokenize(SYSTEM + "".join(stay) + _ask("Good day!") + h.text
                             + "<|im_end|>\n" + question)
    h2 = engine.submit(second, key=key, max_tokens=12)
    h2.result(60)
    st = h2.stats
    new_tail = len(engine.tokenize(question, add_special=False))
    if engine._sched.context_shift:
        assert st.shifted_tokens == gone
        # the turns that stay come from the KV: only the new question (and what the reply's
        # tokens may not share with its re-tokenized text) is decoded
        assert st.cached_tokens >= len(second) - new_tail - 8
        assert st.prefilled_tokens == len(second) - st.cached_tokens
    else:
        assert st.shifted_tokens == 0
        cut = common_prefix_len(first, second)          # the system prompt, "<|im_start|>user"
        assert len(head) <= cut < len(head) + 8
        assert st.cached_tokens == cut                   # decoded again from the cut
        assert st.prefilled_tokens == len(second) - cut
    # what the conversation says it holds is what llama.cpp holds, and the moved cells
    # answer like decoded ones
    held, llama_held = _kv(engine, key)
    assert held == llama_held
    assert "Paris" in h2.text
    # the same prompt again reuses all of it but the last token
    h3 = engine.submit(second, key=key, max_tokens=1)
    h3.result(60)
    assert h3.stats.cached_tokens == len(second) - 1 and h3.stats.shifted_tokens == 0


@pytest.mark.model
def test_a_conversation_cut_and_not_yet_decoded_is_not_saved_with_unrotated_keys(
        smollm2_model, tmp_path):
    """llama.cpp rotates moved keys at the next decode; a state saved before it would hold
    them unrotated at their new positions, so such a conversation is dropped instead."""
    from tryll_fast.engines.llama import LlamaContext
    from tryll_fast.engines.llama.conversations import SlotTable
    from tryll_fast.engines.llama.prefix_cache import PrefixCache
    from tryll_fast.engines.llama.spill import SpillDir
    ctx = LlamaContext(smollm2_model, n_ctx=512, n_seq_max=3, n_batch=128)
    try:
        slots = SlotTable(ctx, PrefixCache(ctx, [2], 64), [0, 1], SpillDir(tmp_path), "host")
        tokens = list(range(1000, 1100))
        for key in ("cut", "decoded"):
            conv = slots.get_or_create(key)
            assert slots.acquire(conv)
            ctx.decode([(conv.seq_id, tokens, False)])
            conv.tokens = list(tokens)
        cut, decoded = slots.get("cut"), slots.get("decoded")
        assert slots.cut(cut, 10, 40) and len(cut.tokens) == 70
        slots.evict(cut)                     # before any decode: not savable
        assert cut.tokens == [] and cut.saved is None
        assert slots.acquire(cut)
        assert slots.cut(decoded, 10, 40)
        ctx.decode([(decoded.seq_id, [5], False)])
        decoded.tokens.append(5)
        slots.shifted.clear()                # what the scheduler does after each decode
        slots.evict(decoded)                 # rotated: saved as usual
        assert decoded.saved is not None and len(decoded.tokens) == 71
    finally:
        ctx.close()
