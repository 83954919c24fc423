"""Shared KV prefixes: prefilled once, attached to any sequence that starts with them.

An entry is a token prefix held by a reserved "cache" seq id. Attaching it to
a conversation is `llama_memory_seq_cp(cache, conv, 0, n)`: with a unified KV
cache the cells gain a second owner instead of being copied, so eight agents
on one 400-token system prompt use 400 cells, not 3 200. Any leading part of
an entry can be attached (a partial copy is legal with kv_unified).

Entries are created from a conversation that has just decoded the prefix
(its cells are copied, i.e. shared, into the cache seq), so making a prefix
shareable costs no extra decode. An entry made from a conversation that had
itself attached an older entry shares that entry's cells too: it records the
older one as `parent` and holds a reference on it, so cells are counted once.

Eviction is LRU among entries nobody references, when the cache seq ids run
out or the entries' own cells exceed `cell_budget`. Evicting drops the cache
seq's claim on the cells; they are freed when no conversation holds them.

Runs on the scheduler thread only.
"""
import itertools
import time

from tryll_fast.engines.llama.context import LlamaContext


class PrefixEntry:
    __slots__ = ("id", "seq_id", "tokens", "parent", "parent_len", "refs", "last_used", "hits")

    def __init__(self, entry_id, seq_id, tokens, parent, parent_len):
        self.id = entry_id
        self.seq_id = seq_id
        self.tokens = tokens          # tuple of token ids
        self.parent = parent          # PrefixEntry whose cells our first parent_len share
        self.parent_len = parent_len
        self.refs = 0                 # conversations attached + child entries
        self.last_used = time.monotonic()
        self.hits = 0

    @property
    def own_cells(self) -> int:
        return len(self.tokens) - self.parent_len


class _Node:
    __slots__ = ("children", "owners")

    def __init__(self):
        self.children: dict[int, _Node] = {}
        self.owners: dict[int, PrefixEntry] = {}


class PrefixTrie:
    """Token-id trie; each node knows the entries whose prefix passes through it."""

    def __init__(self):
        self.root = _Node()

    def insert(self, entry: PrefixEntry) -> None:
        node = self.root
        for t in entry.tokens:
            node = node.children.setdefault(t, _Node())
            node.owners[entry.id] = entry

    def remove(self, entry: PrefixEntry) -> None:
        path = []
        node = self.root
        for t in entry.tokens:
            child = node.children.get(t)
            if child is None:
                break
            path.append((node, t, child))
            node = child
        for parent, t, child in reversed(path):
            child.owners.pop(entry.id, None)
            if not child.owners:
                del parent.children[t]

    def longest(self, tokens) -> tuple[int, PrefixEntry | None]:
        """Length of the longest cached prefix of `tokens` and an entry holding it."""
        node = self.root
        depth = 0
        for t in tokens:
            child = node.children.get(t)
            if child is None:
                break
            node = child
            depth += 1
        if depth == 0:
            return 0, None
        # prefer the shortest entry that covers the match: it is cheapest to keep
        best = min(node.owners.values(), key=lambda e: len(e.tokens))
        return depth, best


class PrefixCache:
    def __init__(self, ctx: LlamaContext, seq_ids, cell_budget: int):
        self.ctx = ctx
        self.free_seq_ids = list(seq_ids)
        self.capacity = len(self.free_seq_ids)
        self.cell_budget = cell_budget
        self.trie = PrefixTrie()
        self.entries: dict[int, PrefixEntry] = {}
        self._ids = itertools.count(1)

    def lookup(self, tokens) -> tuple[int, PrefixEntry | None]:
        return self.trie.longest(tokens)

    def attach(self, entry: PrefixEntry, dst_seq: int, n: int) -> None:
        """Give the (empty) sequence dst_seq the entry's first n cells."""
        self.ctx.seq_cp(entry.seq_id, dst_seq, n)
        entry.refs += 1
        entry.hits += 1
        entry.last_used = time.monotonic()

    def detach(self, entry: PrefixEntry) -> None:
        entry.refs -= 1
        entry.last_used = time.monotonic()
        self._trim()

    def register(self, src_seq: int, tokens, parent: PrefixEntry | None,
                 parent_len: int) -> PrefixEntry | None:
        """Share src_seq's first len(tokens) cells as a new entry.

        None if an entry already holds exactly these tokens or there is no room."""
        tokens = tuple(tokens)
        n, existing = self.lookup(tokens)
        if existing is not None and n == len(tokens):
            return None
        own = len(tokens) - parent_len
        if own > self.cell_budget:
            return None
        if not self.free_seq_ids and not self._evict_one():
            return None
        seq = self.free_seq_ids.pop()
        self.ctx.seq_cp(src_seq, seq, len(tokens))
        parent = parent if parent_len else None
        entry = PrefixEntry(next(self._ids), seq, tokens, parent, parent_len)
        if entry.parent is not None:
            entry.parent.refs += 1
        self.entries[entry.id] = entry
        self.trie.insert(entry)
        self._trim(keep=entry)
        return entry

    def cells(self) -> int:
        return sum(e.own_cells for e in self.entries.values())

    def _evict_one(self, keep: PrefixEntry | None = None) -> bool:
        idle = [e for e in self.entries.values() if e.refs == 0 and e is not keep]
        if not idle:
            return False
        self.evict(min(idle, key=lambda e: e.last_used))
        return True

    def _trim(self, keep: PrefixEntry | None = None) -> None:
        while self.cells() > self.cell_budget and self._evict_one(keep):
            pass

    def evict(self, entry: PrefixEntry) -> None:
        if entry.refs:
            raise RuntimeError(f"prefix {entry.id} still has {entry.refs} references")
        self.trie.remove(entry)
        del self.entries[entry.id]
        self.ctx.seq_rm(entry.seq_id, 0)
        self.free_seq_ids.append(entry.seq_id)
        if entry.parent is not None:
            entry.parent.refs -= 1

    def evict_idle(self) -> int:
        """Drop every unreferenced entry (children before parents); returns how many."""
        n = 0
        while self._evict_one():
            n += 1
        return n

    def describe(self) -> list[dict]:
        bpc = self.ctx.kv_bytes_per_cell
        return [{
            "id": e.id, "seq_id": e.seq_id, "tokens": len(e.tokens), "own_cells": e.own_cells,
            "kv_bytes": e.own_cells * bpc, "refs": e.refs, "hits": e.hits,
            "parent": e.parent.id if e.parent else None,
        } for e in self.entries.values()]
