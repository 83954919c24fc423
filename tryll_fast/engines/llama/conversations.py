"""Conversation sequences (one per agent x LLM node) and the seq-id slots they occupy.

A conversation keeps its KV between requests so the next turn decodes only
what changed. Seq ids and KV cells are scarce, so an idle conversation can be
evicted: its state (llama_state_seq_get_data) goes to a file (spill.py, the
default tier: the memory is given back) or to a host copy (tier "host": no disk,
but the copy holds the memory), and comes back, into whichever seq id is free,
when its next request is admitted; a state that cannot come back (file gone or
damaged, KV full) means the request re-prefills. Slot policy: a request that
needs a slot takes a free one, else evicts the least recently used idle resident
conversation; if every resident conversation is busy the request stays queued.

A restored conversation holds private copies of the cells it once shared with
a cached prefix (the state blob carries them); it stops referencing the entry.

Runs on the scheduler thread only.
"""
import logging
import time

from tryll_fast.engines.llama.context import LlamaContext
from tryll_fast.engines.errors import EngineError, InvalidRequest
from tryll_fast.engines.llama.prefix_cache import PrefixCache, PrefixEntry
from tryll_fast.engines.llama.spill import SpillDir, SpillFile

log = logging.getLogger(__name__)

TIERS = ("file", "host")   # where an evicted conversation's state goes


class Conversation:
    __slots__ = ("key", "seq_id", "tokens", "saved", "spill", "prefix", "shared_len",
                 "busy", "last_used", "anonymous")

    def __init__(self, key, anonymous: bool = False):
        self.key = key
        self.seq_id: int | None = None
        self.tokens: list[int] = []       # exactly what the KV (or the saved blob) holds
        self.saved: bytes | None = None   # host copy while evicted (tier "host")
        self.spill: SpillFile | None = None   # its file while evicted (tier "file")
        self.prefix: PrefixEntry | None = None
        self.shared_len = 0               # leading cells shared with `prefix`
        self.busy = False
        self.last_used = time.monotonic()
        self.anonymous = anonymous

    @property
    def resident(self) -> bool:
        return self.seq_id is not None

    @property
    def stored(self) -> str | None:
        """Where the evicted state waits: "file", "host" or None (resident, or nothing)."""
        return "file" if self.spill is not None else "host" if self.saved is not None else None

    @property
    def private_cells(self) -> int:
        return len(self.tokens) - self.shared_len if self.resident else 0


class SlotTable:
    def __init__(self, ctx: LlamaContext, cache: PrefixCache, seq_ids,
                 spill: SpillDir | None = None, tier: str = "file"):
        if tier not in TIERS:
            raise InvalidRequest(f"eviction tier {tier!r} is not one of {', '.join(TIERS)}")
        self.ctx = ctx
        self.cache = cache
        self.spill = spill if spill is not None else SpillDir()
        self.tier = tier
        self.free = list(reversed(seq_ids))
        self.convs: dict[object, Conversation] = {}
        # cut since the last decode: llama.cpp rotates moved keys at the next decode, and a
        # saved state would keep them unrotated at their new positions
        self.shifted: set[Conversation] = set()

    def get(self, key) -> Conversation | None:
        return self.convs.get(key)

    def get_or_create(self, key, anonymous: bool = False) -> Conversation:
        conv = self.convs.get(key)
        if conv is None:
            conv = self.convs[key] = Conversation(key, anonymous)
        return conv

    def acquire(self, conv: Conversation) -> bool:
        """Make conv resident; False if no slot can be freed right now."""
        if conv.resident:
            return True
        if not self.free and not self._evict_lru():
            return False
        conv.seq_id = self.free.pop()
        data = None
        if conv.spill is not None:
            spill, conv.spill = conv.spill, None
            data = self.spill.take(spill, len(conv.tokens))
            if data is None:
                conv.tokens = []   # the file is gone or damaged: the prompt re-prefills
        elif conv.saved is not None:
            data, conv.saved = conv.saved, None
        if data is not None:
            try:
                n = self.ctx.state_seq_set(conv.seq_id, data)
            except EngineError:
                n = -1
            if n != len(conv.tokens):
                # could not restore (KV full): start over, the prompt re-prefills
                self.ctx.seq_rm(conv.seq_id, 0)
                conv.tokens = []
                return True
        return True

    def _evict_lru(self) -> bool:
        idle = [c for c in self.convs.values() if c.resident and not c.busy]
        if not idle:
            return False
        self.evict(min(idle, key=lambda c: c.last_used))
        return True

    def evict(self, conv: Conversation, tier: str | None = None) -> None:
        """Move an idle conversation's KV to a file (or, tier "host", to host memory) and
        free its cells and seq id."""
        tier = self.tier if tier is None else tier
        if tier not in TIERS:
            raise InvalidRequest(f"eviction tier {tier!r} is not one of {', '.join(TIERS)}")
        if conv.busy:
            raise EngineError(f"conversation {conv.key!r} is busy; cancel its request first")
        if not conv.resident:
            return
        if not conv.tokens or conv.anonymous or conv in self.shifted:
            conv.tokens = []          # nothing worth keeping, or not savable: re-prefill
        elif tier == "host":
            conv.saved = self.ctx.state_seq_get(conv.seq_id)
        else:
            buf = self.ctx.state_seq_buffer(conv.seq_id)
            try:
                conv.spill = self.spill.write(buf, len(conv.tokens))
            except OSError as exc:
                # giving the memory back matters more than a fast restore
                log.warning("could not spill KV state to %s (%s); the conversation will "
                            "re-prefill", self.spill.root, exc)
                conv.tokens = []
            del buf
        self._drop_kv(conv)

    def release(self, conv: Conversation) -> None:
        """Forget the conversation: KV, host copy or file, and slot."""
        if conv.resident:
            self._drop_kv(conv)
        self._forget_saved(conv)
        conv.tokens = []
        self.convs.pop(conv.key, None)

    def _forget_saved(self, conv: Conversation) -> None:
        conv.saved = None
        if conv.spill is not None:
            spill, conv.spill = conv.spill, None
            self.spill.discard(spill)

    def close(self) -> None:
        """The engine is closing: delete every spilled file and the directory."""
        for conv in self.convs.values():
            conv.spill = None
            conv.saved = None
        self.spill.close()

    def _drop_kv(self, conv: Conversation) -> None:
        self.shifted.discard(conv)
        self.ctx.seq_rm(conv.seq_id, 0)
        self.free.append(conv.seq_id)
        conv.seq_id = None
        self._unshare(conv)

    def truncate(self, conv: Conversation, keep: int) -> None:
        """Roll the KV tail back so the conversation holds its first `keep` tokens."""
        self.ctx.seq_rm(conv.seq_id, keep)
        del conv.tokens[keep:]
        if conv.shared_len > keep:
            conv.shared_len = keep
            if keep == 0:
                self._unshare(conv)

    def cut(self, conv: Conversation, start: int, end: int) -> bool:
        """Drop the conversation's tokens [start, end) and move the later ones down (a
        context shift); False, changing nothing, when the cache cannot move cells. Only
        past its shared prefix: shared cells would move for every sequence holding them."""
        if start < conv.shared_len or not self.ctx.seq_cut(conv.seq_id, start, end):
            return False
        del conv.tokens[start:end]
        self.shifted.add(conv)
        return True

    def attach(self, conv: Conversation, entry: PrefixEntry, n: int, tokens) -> None:
        """Replace whatever conv holds with the entry's first n cells."""
        self.truncate(conv, 0)
        self._unshare(conv)
        self.cache.attach(entry, conv.seq_id, n)
        conv.prefix = entry
        conv.shared_len = n
        conv.tokens = list(tokens[:n])

    def share_as_prefix(self, conv: Conversation, n: int) -> PrefixEntry | None:
        """Register conv's first n tokens in the prefix cache and share them from now on."""
        parent_len = min(conv.shared_len, n)
        entry = self.cache.register(conv.seq_id, conv.tokens[:n], conv.prefix, parent_len)
        if entry is None:
            return None
        entry.refs += 1
        old = conv.prefix
        conv.prefix = entry
        conv.shared_len = n
        if old is not None:
            self.cache.detach(old)
        return entry

    def _unshare(self, conv: Conversation) -> None:
        if conv.prefix is not None:
            entry, conv.prefix = conv.prefix, None
            conv.shared_len = 0
            self.cache.detach(entry)

    def describe(self) -> dict:
        bpc = self.ctx.kv_bytes_per_cell
        out = {}
        for c in self.convs.values():
            out[repr(c.key)] = {
                "key": c.key, "seq_id": c.seq_id, "resident": c.resident, "busy": c.busy,
                "tokens": len(c.tokens), "shared_cells": c.shared_len if c.resident else 0,
                "private_cells": c.private_cells, "kv_bytes": c.private_cells * bpc,
                "host_bytes": len(c.saved) if c.saved else 0,
                "spill_bytes": c.spill.size if c.spill else 0,   # on disk, not in RAM
                "stored": c.stored,
                "prefix": c.prefix.id if c.prefix else None,
            }
        return out
