"""PrefixCache on a real context: trie lookup, partial attach, references, LRU under a budget."""
import pytest

from tryll_fast.engines.llama import LlamaContext
from tryll_fast.engines.llama.prefix_cache import PrefixCache, PrefixTrie



def test_trie_finds_longest_prefix_and_forgets_removed_entries():
    from tryll_fast.engines.llama.prefix_cache import PrefixEntry
    trie = PrefixTrie()
    a = PrefixEntry(1, 5, (1, 2, 3, 4), None, 0)
    b = PrefixEntry(2, 6, (1, 2, 9), None, 0)
    trie.insert(a)
    trie.insert(b)
    assert trie.longest([1, 2, 3, 4, 5]) == (4, a)
    assert trie.longest([1, 2, 3, 7]) == (3, a)
    assert trie.longest([1, 2, 9, 9]) == (3, b)
    n, e = trie.longest([1, 2, 7])
    assert n == 2 and e in (a, b)
    assert trie.longest([7]) == (0, None)
    trie.remove(a)
    assert trie.longest([1, 2, 3, 4]) == (2, b)
    trie.remove(b)
    assert trie.root.children == {}


@pytest.fixture
def ctx(smollm2_model):
    c = LlamaContext(smollm2_model, n_ctx=512, n_seq_max=6, n_batch=64)
    yield c
    c.close()


def prefix(i, n=20):
    return [100 + i] + list(range(200, 200 + n - 1))


@pytest.mark.model
def test_register_attach_partially_and_release(ctx):
    cache = PrefixCache(ctx, [4, 5], cell_budget=100)
    ctx.decode([(0, prefix(0), False)])
    e = cache.register(0, prefix(0), None, 0)
    assert e.seq_id in (4, 5) and ctx.seq_pos_max(e.seq_id) == 19
    assert cache.register(0, prefix(0), None, 0) is None  # already cached
    n, found = cache.lookup(prefix(0)[:12] + [7, 7])
    assert (n, found) == (12, e)
    cache.attach(e, 1, n)  # a partial copy of the shared cells
    assert ctx.seq_pos_max(1) == 11 and e.refs == 1
    ctx.decode([(1, [7, 7], True)])
    assert ctx.seq_pos_max(1) == 13
    cache.detach(e)
    assert e.refs == 0 and cache.cells() == 20


@pytest.mark.model
def test_lru_eviction_under_the_cell_budget_spares_referenced_entries(ctx):
    cache = PrefixCache(ctx, [4, 5], cell_budget=40)
    entries = []
    for i in range(2):
        ctx.decode([(i, prefix(i), False)])
        entries.append(cache.register(i, prefix(i), None, 0))
    a, b = entries
    cache.attach(a, 2, 20)  # a is in use, b is idle
    ctx.decode([(3, prefix(3), False)])
    ctx.seq_rm(0)
    ctx.seq_rm(1)
    c = cache.register(3, prefix(3), None, 0)
    assert c is not None
    assert set(cache.entries.values()) == {a, c}  # b (idle, least recent) went
    assert ctx.seq_pos_max(b.seq_id) == -1 or b.seq_id == c.seq_id
    assert cache.cells() == 40
    # both remaining entries are needed or recent: nothing more fits
    ctx.decode([(1, prefix(4), False)])
    cache.detach(a)
    cache.attach(c, 0, 20)
    assert cache.register(1, prefix(4), None, 0) is not None  # a was idle: evicted
    assert a.id not in cache.entries
    assert cache.evict_idle() == 1  # the new one; c is still attached
    assert list(cache.entries.values()) == [c]


@pytest.mark.model
def test_child_entry_keeps_its_parent(ctx):
    cache = PrefixCache(ctx, [4, 5], cell_budget=100)
    ctx.decode([(0, prefix(0), False)])
    parent = cache.register(0, prefix(0), None, 0)
    cache.attach(parent, 1, 20)
    ctx.decode([(1, [5, 6, 7, 8], False)])
    child = cache.register(1, prefix(0) + [5, 6, 7, 8], parent, 20)
    assert child.own_cells == 4 and parent.refs == 2
    cache.detach(parent)
    assert cache.cells() == 24
    assert cache.evict_idle() == 2  # the child first, then its parent
    assert cache.cells() == 0
