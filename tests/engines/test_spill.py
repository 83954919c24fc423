"""Eviction to a file (spill.py) with the real SmolLM2 and real files: an evicted
conversation holds no bytes in the process, comes back from its file exactly as it was, and
a file that is missing, damaged or unwritable means a correct re-prefill."""
import os
import re
import stat

import pytest

from engine_prompts import chatml
from tryll_fast.engines.llama import InvalidRequest, LlamaEngine
from tryll_fast.engines.llama.spill import default_root


QUESTION = "Tell me a short story about a lighthouse keeper and a storm."


@pytest.fixture
def root(tmp_path):
    return tmp_path / "kv"


@pytest.fixture
def engine(smollm2_model, root):
    eng = LlamaEngine(smollm2_model, n_ctx=1024, n_slots=4, n_prefix_slots=1, n_batch=128,
                      spill_dir=root)
    yield eng
    eng.close()


def files(root):
    return sorted(root.rglob("*.kv"))


def unbroken(eng, prompt, key=("ref", 0), n=8):
    """The reference: prefilled, then generated, never evicted."""
    eng.prefill(key, prompt).result(60)
    h = eng.submit(prompt, key=key, max_tokens=n)
    h.result(60)
    return h


def fresh(eng, prompt, key=("fresh", 0), n=8):
    """What a re-prefill produces: the whole prompt decoded by the generating request."""
    h = eng.submit(prompt, key=key, max_tokens=n)
    h.result(60)
    return h


@pytest.mark.model
def test_evict_writes_a_file_and_restore_reads_it_back(engine, root):
    prompt = engine.tokenize(chatml(QUESTION))
    ref = unbroken(engine, prompt)
    key = ("npc", "dialog")
    engine.prefill(key, prompt).result(60)
    assert files(root) == []
    engine.evict(key)
    [path] = files(root)
    assert re.fullmatch(r"\d{8}\.kv", path.name)           # a counter, never the key
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert path.parent.name.startswith(f"pid{os.getpid()}-")
    held = engine.conversation(key)
    assert (held["resident"], held["saved"], held["stored"], held["tokens"]) == \
        (False, True, "file", len(prompt))
    conv = engine._sched.slots.get(key)
    assert conv.saved is None and conv.seq_id is None      # no bytes kept in the process
    mem = engine.memory()
    seq = mem["sequences"][repr(key)]
    assert seq["host_bytes"] == 0 and seq["kv_bytes"] == 0 and seq["private_cells"] == 0
    assert seq["spill_bytes"] == path.stat().st_size > len(prompt) * mem["context"][
        "kv_bytes_per_cell"]
    assert mem["host_bytes"] == 0 and mem["spill_bytes"] == path.stat().st_size
    assert mem["spill"]["files"] == 1

    h = engine.submit(prompt, key=key, max_tokens=8)
    h.result(60)
    assert h.stats.restored
    assert h.stats.cached_tokens == len(prompt) - 1 and h.stats.prefilled_tokens == 1
    assert h.tokens == ref.tokens and h.text == ref.text
    assert files(root) == []                               # deleted once read back
    assert engine.memory()["spill_bytes"] == 0
    assert engine.conversation(key)["stored"] is None


@pytest.mark.model
def test_a_restored_conversation_decodes_only_what_changed(engine, root):
    key = ("npc", 1)
    p1 = engine.tokenize(chatml("Hi, who are you?"))
    h1 = engine.submit(p1, key=key, max_tokens=6)
    h1.result(60)
    engine.evict(key)
    assert len(files(root)) == 1
    p2 = p1 + h1.tokens + engine.tokenize("\nAnd where do you live?", add_special=False)
    h2 = engine.submit(p2, key=key, max_tokens=6)
    h2.result(60)
    assert h2.stats.restored
    held = len(p1) + len(h1.tokens) - 1   # the last sampled token was never decoded
    assert h2.stats.cached_tokens == held
    assert h2.stats.prefilled_tokens == len(p2) - held


@pytest.mark.model
def test_lru_eviction_spills_and_restores(smollm2_model, root, tmp_path):
    prompts = [chatml(f"Give me a number bigger than {i}, and say why.") for i in range(5)]

    # reference: every conversation resident, run one at a time
    with LlamaEngine(smollm2_model, n_ctx=2048, n_slots=5, n_prefix_slots=1, n_batch=128,
                     spill_dir=tmp_path / "ref") as ref:
        want = []
        for i, p in enumerate(prompts):
            ref.prefill(i, ref.tokenize(p)).result(60)
        for i, p in enumerate(prompts):
            h = ref.submit(ref.tokenize(p), key=i, max_tokens=6)
            h.result(60)
            want.append(h.tokens)
        assert not files(tmp_path / "ref")
    with LlamaEngine(smollm2_model, n_ctx=2048, n_slots=2, n_prefix_slots=1, n_batch=128,
                     spill_dir=root) as eng:
        for i, p in enumerate(prompts):
            eng.prefill(i, eng.tokenize(p)).result(60)
        # five conversations, two slots: three live in files
        mem = eng.memory()
        assert sum(s["resident"] for s in mem["sequences"].values()) == 2
        assert sorted(s["stored"] or "" for s in mem["sequences"].values()) == \
            ["", "", "file", "file", "file"]
        assert len(files(root)) == 3 and mem["host_bytes"] == 0
        got = []
        for i, p in enumerate(prompts):
            h = eng.submit(eng.tokenize(p), key=i, max_tokens=6)
            h.result(60)
            assert h.stats.prefilled_tokens == 1   # restored or resident: never re-prefilled
            got.append(h.tokens)
        assert got == want
        assert eng.memory()["spill"]["restores"] >= 3 and eng.memory()["spill"]["failures"] == 0
        # the spills of this walk are all on disk or already read back
        mem = eng.memory()
        assert len(files(root)) == sum(s["stored"] == "file" for s in mem["sequences"].values())


@pytest.mark.model
@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "garbage"])
def test_a_damaged_file_falls_back_to_re_prefill(engine, root, damage):
    prompt = engine.tokenize(chatml(QUESTION))
    ref = fresh(engine, prompt)
    key = ("npc", damage)
    engine.prefill(key, prompt).result(60)
    engine.evict(key)
    [path] = files(root)
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "flipped":
        mid = len(data) // 2
        path.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:])
    else:
        path.write_bytes(os.urandom(len(data)))
    h = engine.submit(prompt, key=key, max_tokens=8)
    h.result(60)
    assert h.error is None
    assert not h.stats.restored
    assert h.stats.prefilled_tokens == len(prompt)
    assert h.tokens == ref.tokens
    assert files(root) == []
    assert engine.memory()["spill"]["failures"] == 1


@pytest.mark.model
def test_release_deletes_the_file(engine, root):
    prompt = engine.tokenize(chatml(QUESTION))
    for i in range(2):
        engine.prefill(("npc", i), prompt).result(60)
        engine.evict(("npc", i))
    assert len(files(root)) == 2
    engine.release(("npc", 0))
    assert len(files(root)) == 1
    assert engine.conversation(("npc", 0)) is None
    assert engine.memory()["spill"]["files"] == 1


@pytest.mark.model
def test_close_removes_the_engine_directory(smollm2_model, root):
    stale = root / "pid999999999-gone-abc"         # left by a process that died
    mine = root / f"pid{os.getpid()}-other-xyz"    # a live engine's: not touched
    for d in (stale, mine):
        d.mkdir(parents=True)
        (d / "00000001.kv").write_bytes(b"x")
    eng = LlamaEngine(smollm2_model, n_ctx=1024, n_slots=2, n_prefix_slots=1, n_batch=128,
                      spill_dir=root)
    try:
        prompt = eng.tokenize(chatml(QUESTION))
        for i in range(2):
            eng.prefill(i, prompt).result(60)
            eng.evict(i)
        own = eng.memory()["spill"]["dir"]
        assert own and len(list(os.scandir(own))) == 2
        assert not stale.exists() and mine.exists()
    finally:
        eng.close()
    assert not os.path.exists(own)
    assert sorted(p.name for p in root.iterdir()) == [mine.name]


@pytest.mark.model
def test_an_engine_that_never_evicts_creates_no_directory(smollm2_model, root):
    with LlamaEngine(smollm2_model, n_ctx=512, n_slots=2, n_prefix_slots=1, n_batch=64,
                     spill_dir=root) as eng:
        eng.submit(chatml("Hi"), key="k", max_tokens=2).result(60)
    assert not root.exists()


@pytest.mark.model
def test_unwritable_spill_dir_frees_instead(smollm2_model, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    with LlamaEngine(smollm2_model, n_ctx=1024, n_slots=2, n_prefix_slots=1, n_batch=128,
                     spill_dir=blocker) as eng:
        prompt = eng.tokenize(chatml(QUESTION))
        ref = fresh(eng, prompt)
        eng.release(("fresh", 0))
        eng.prefill("k", prompt).result(60)
        eng.evict("k")
        held = eng.conversation("k")
        assert (held["resident"], held["saved"], held["tokens"]) == (False, False, 0)
        assert eng.memory()["context"]["kv_cells_used"] == 0
        h = eng.submit(prompt, key="k", max_tokens=8)
        h.result(60)
        assert h.stats.prefilled_tokens == len(prompt) and h.tokens == ref.tokens


@pytest.mark.model
def test_host_tier_keeps_a_copy_and_no_file(smollm2_model, root):
    with LlamaEngine(smollm2_model, n_ctx=1024, n_slots=2, n_prefix_slots=1, n_batch=128,
                     evict_to="host", spill_dir=root) as eng:
        prompt = eng.tokenize(chatml(QUESTION))
        ref = unbroken(eng, prompt)
        eng.release(("ref", 0))
        eng.prefill("k", prompt).result(60)
        eng.evict("k")
        seq = eng.memory()["sequences"][repr("k")]
        assert seq["stored"] == "host" and seq["host_bytes"] > 0 and seq["spill_bytes"] == 0
        assert not root.exists()
        h = eng.submit(prompt, key="k", max_tokens=8)
        h.result(60)
        assert h.stats.restored and h.stats.prefilled_tokens == 1 and h.tokens == ref.tokens
        # a per-call tier overrides the engine's
        eng.evict("k", tier="file")
        assert len(files(root)) == 1 and eng.memory()["host_bytes"] == 0
        with pytest.raises(InvalidRequest):
            eng.evict("k", tier="disk")
    with pytest.raises(InvalidRequest):
        LlamaEngine(smollm2_model, evict_to="nowhere")


def test_default_root_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_root() == tmp_path / "tryll_fast" / "kv"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_root() == default_root().home() / ".cache" / "tryll_fast" / "kv"
