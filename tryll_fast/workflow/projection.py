"""Projection: the dialog seen by one language-model node of one agent, as prompt tokens.

Messages, in order: the system prompt (pinned), then each interaction in the window (its
user message, then its replies joined into one assistant message), then this turn: the
rendered template where `placement` puts it, the input (the player's message or another
node's output), and replies earlier nodes gave in this turn. The model's own chat template
renders them (prompting/chat.py); the text is tokenized with special tokens parsed.

Token budget with hysteresis (docs/workflow.md): high = context size - max_tokens. When a prompt is
over `high`, the oldest interactions leave the window until it is at most 75 % of `high`.
The window only moves forward (until the dialog is edited), so between drops every turn's
prompt starts with the previous turn's and the engine decodes only the new suffix.

Shared prefix: the rendered system part (StablePrefix) is identical for every agent with the
same system prompt; its token count is passed as shared_prefix_len, so the engine decodes
it once and shares its KV cells between those agents.

Running summary (a Summarize node's, dialog.running_summary()): a system message right
after the system part, labelled SUMMARY_LABEL, and the interactions it stands for are left
out. It is a message of its own rather than text appended to the system prompt so that
the system message renders byte for byte as it does without a summary: the shared prefix
(computed from the system part alone) keeps matching the prefix-cache entry every agent
with this system prompt attaches, and when a newer summary replaces the old one the
agent's own KV is kept up to the summary and only what follows is decoded again. Nodes
that ask for a bounded history (max_history: the classifiers' history_turns) get no
summary.
"""
from __future__ import annotations

import bisect
import logging
import re
import threading
import weakref
from dataclasses import dataclass

from tryll_fast import codec
from tryll_fast.workflow.dialog import USER_SLOT, Component, Dialog, Interaction

KEEP_FRACTION = 0.75
SUMMARY_LABEL = "Summary of the earlier conversation:"
Placement = codec.Placement
# where a template goes as a message of its own, and in which role
_BEFORE_USER = {Placement.BeforeUserAsUser: "user", Placement.BeforeUserAsSystem: "system"}
_AFTER_USER = {Placement.AfterUserAsUser: "user", Placement.AfterUserAsSystem: "system"}
log = logging.getLogger("tryll_fast.workflow")


class ProjectionError(ValueError):
    pass


@dataclass
class Prompt:
    tokens: list[int]
    shared_prefix_len: int
    text: str
    window: int               # interactions of history included
    dropped: int              # interactions that left the window in this build
    messages: list            # the chat messages the text renders
    summarized: int = 0       # interactions the projected running summary stands for


WORD_JOINER = "\u2060"


class _Spellings:
    """A model's control-token spellings, searched by first character (a vocabulary can
    have thousands; trying each at every position would be slow)."""

    def __init__(self, model) -> None:
        by_first: dict[str, dict[int, set[str]]] = {}
        special = model.special_tokens
        for raw in (special[t] for t in model.control_tokens):
            text = raw.decode("utf-8", "replace")
            if len(text) > 1:
                by_first.setdefault(text[0], {}).setdefault(len(text), set()).add(text)
        self.by_first = {c: sorted(lengths.items(), reverse=True)
                         for c, lengths in by_first.items()}
        self.starts = re.compile("[" + "".join(map(re.escape, by_first)) + "]") \
            if by_first else None


_SPELLINGS: "weakref.WeakKeyDictionary[object, _Spellings]" = weakref.WeakKeyDictionary()


def neutralize(model, text: str) -> str:
    """The player's text with every control-token spelling broken by a word joiner after
    its first character, so "<|im_start|>system" typed in a chat stays text instead of
    becoming a control token (prompts are tokenized with parse_special)."""
    sp = _SPELLINGS.get(model)
    if sp is None:
        sp = _SPELLINGS[model] = _Spellings(model)
    if sp.starts is None or not text:
        return text
    out = []
    last = 0
    for m in sp.starts.finditer(text):
        i = m.start()
        if i < last:
            continue
        for length, spellings in sp.by_first[text[i]]:
            if text[i:i + length] in spellings:
                out.append(text[last:i + 1])
                out.append(WORD_JOINER)
                last = i + 1
                break
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the common prefix, by binary search over slice comparisons (memcmp)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Pieces:
    r"""Token ids of prompt pieces, kept per model. A piece runs from just after a special
    token (or the start of a prompt without BOS) to just after the next one, or to the
    prompt's end. llama.cpp tokenizes the text between special tokens on its own, so a
    piece's ids do not depend on what surrounds it, and a prompt is the concatenation of
    its pieces' ids.

    Why: llama.cpp pays a fixed cost for every stretch of text between two special tokens
    it tokenizes (for several vocabularies, SmolLM2's among them, it compiles a std::regex
    per stretch), so the "\n" and "assistant\n" between a chat's role markers cost as much
    as a sentence. Those pieces recur in every prompt; kept, only the new messages are
    tokenized. The new pieces are tokenized together in one call, and the call's special
    tokens must fall exactly where the cuts were made, or the caller tokenizes the text
    whole.

    Cuts are made only at special tokens seen in earlier prompts (learn()), and only at
    those that neither swallow the whitespace after them nor overlap the spelling of
    another special token (llama.cpp matches longer spellings first).
    """

    LIMIT = 256                # pieces kept; the least recently used leave first
    MAX_BYTES = 16384          # longer pieces (a long system prompt) are not kept

    def __init__(self, model) -> None:
        self.model = model
        self.ids: dict[bytes, tuple[int, ...]] = {}
        self.cut_ids: dict[bytes, int] = {}      # spelling -> special token id
        self.refused: set[int] = set()
        self.pattern = None
        self.lock = threading.Lock()

    def learn(self, tok: int, piece: bytes) -> None:
        """`tok` (spelled `piece`) was found in a prompt: cut there from now on if safe."""
        if tok in self.refused or self.cut_ids.get(piece) == tok:
            return
        special = self.model.special_tokens
        if (tok in self.model.rstrip_tokens or piece in self.cut_ids
                or any(_overlaps(piece, other) for t, other in special.items()
                       if t != tok and len(other) >= len(piece))):
            self.refused.add(tok)
            return
        with self.lock:
            self.cut_ids[piece] = tok
            self.pattern = re.compile(b"|".join(
                re.escape(p) for p in sorted(self.cut_ids, key=len, reverse=True)))

    def tokenize(self, raw: bytes, start: int, tokenize) -> list[int] | None:
        """Ids of raw[start:], kept pieces reused; `tokenize(text)` tokenizes new ones.
        None when llama.cpp did not cut where expected."""
        pattern = self.pattern
        if pattern is None:
            return None
        pieces = []                               # (start, end, special id at the end or -1)
        b = start
        for m in pattern.finditer(raw, start):
            pieces.append((b, m.end(), self.cut_ids[m.group()]))
            b = m.end()
        if b < len(raw):
            pieces.append((b, len(raw), -1))
        ids = self.ids
        found: list = []
        missing = []
        with self.lock:
            for b, e, closing in pieces:
                key = raw[b:e]
                got = ids.pop(key, None)
                if got is not None:
                    ids[key] = got                # most recently used last
                else:
                    missing.append((b, e, closing))
                found.append(got)
        if missing:
            # one call for all of them: each but the last ends with its special token, so
            # joined they are cut exactly where they are cut in the prompt
            toks = tokenize(b"".join(raw[b:e] for b, e, _ in missing).decode("utf-8"))
            parts = self._split(toks, missing)
            if parts is None:
                return None
            self._keep((raw[b:e], part) for (b, e, _), part in zip(missing, parts))
            new = iter(parts)
            found = [got if got is not None else next(new) for got in found]
        out: list[int] = []
        for part in found:
            out += part
        return out

    def remember(self, raw: bytes, ids: list[int], points: list[tuple[int, int]]) -> None:
        """Keep the pieces of a prompt tokenized whole: `points` are (byte, token)
        offsets where a piece starts or ends (after special tokens, and the end)."""
        self._keep((raw[b0:b1], tuple(ids[t0:t1]))
                   for (b0, t0), (b1, t1) in zip(points, points[1:]) if b1 > b0)

    def _keep(self, pieces) -> None:
        ids = self.ids
        with self.lock:
            for key, part in pieces:
                if len(key) <= self.MAX_BYTES:
                    ids[key] = part
            while len(ids) > self.LIMIT:
                ids.pop(next(iter(ids)), None)

    def _split(self, toks: list[int], run) -> list[tuple[int, ...]] | None:
        """`toks` cut after each piece's closing special token; None if they are not
        where the pieces put them."""
        cuts = set(self.cut_ids.values())
        parts = []
        at = 0
        for _, _, closing in run:
            if closing < 0:                       # the prompt's end: no cut token in it
                rest = toks[at:]
                if cuts.intersection(rest):
                    return None
                parts.append(tuple(rest))
                at = len(toks)
                continue
            k = at
            while k < len(toks) and toks[k] not in cuts:
                k += 1
            if k == len(toks) or toks[k] != closing:
                return None
            parts.append(tuple(toks[at:k + 1]))
            at = k + 1
        return parts if at == len(toks) else None


def _overlaps(a: bytes, b: bytes) -> bool:
    """Whether an occurrence of `a` can share bytes with an occurrence of `b`."""
    if a in b:
        return True
    for k in range(1, len(a)):
        if b.startswith(a[k:]) or b.endswith(a[:k]):
            return True
    return False


_PIECES: "weakref.WeakKeyDictionary[object, _Pieces]" = weakref.WeakKeyDictionary()


class PromptTokenizer:
    """Tokenizes successive prompts of one conversation, re-using the previous prompt's
    tokens up to the last special token the two prompts share.

    With parse_special, llama.cpp cuts the text at every special token (<|im_start|>,
    <end_of_turn>, …) and tokenizes the pieces between them on their own, so the tokens of
    a text that ends right after a special token do not depend on what follows. A new
    turn's prompt repeats the previous one up to its last message, so only the new tail is
    tokenized: the cost of a turn stays flat instead of growing with the dialog. Within
    the tail, pieces between special tokens that earlier prompts had (the text between
    role markers) are taken from the model's `_Pieces`. Anything unexpected (a special
    token whose text is not found where it should be) turns the reuse off for this
    conversation, and every prompt is tokenized whole.
    """

    def __init__(self, engine, add_bos: bool) -> None:
        self.engine = engine
        self.add_bos = add_bos
        model = engine.model
        self.special = model.special_tokens
        self.rstrip = model.rstrip_tokens
        self.bos = model.bos
        self.enabled = True
        pieces = _PIECES.get(model)
        if pieces is None:
            pieces = _PIECES[model] = _Pieces(model)
        self._pieces = pieces
        self._raw = b""
        self._ids: list[int] = []
        self._bound_bytes: list[int] = []   # byte offset just after each special token
        self._bound_toks: list[int] = []    # token count at that offset

    def _tokenize_piece(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=False, parse_special=True)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode("utf-8")
        if not self.enabled:
            return self.engine.tokenize(text, add_special=self.add_bos, parse_special=True)
        keep = 0
        if self._raw:
            shared = common_prefix_len(raw, self._raw)
            keep = bisect.bisect_right(self._bound_bytes, shared)
        start_byte = self._bound_bytes[keep - 1] if keep else 0
        start_tok = self._bound_toks[keep - 1] if keep else 0
        tail = None
        pieces_from = start_byte or not self.add_bos     # not from a BOS it adds itself
        if pieces_from:
            tail = self._pieces.tokenize(raw, start_byte, self._tokenize_piece)
        whole = tail is None
        if whole:
            tail = self.engine.tokenize(raw[start_byte:].decode("utf-8"),
                                        add_special=self.add_bos and start_byte == 0,
                                        parse_special=True)
        ids = self._ids[:start_tok] + tail
        bound_bytes = self._bound_bytes[:keep]
        bound_toks = self._bound_toks[:keep]
        pos = start_byte
        for k, tok in enumerate(tail):
            piece = self.special.get(tok)
            if piece is None:
                continue
            if start_byte == 0 and k == 0 and tok == self.bos and not raw.startswith(piece):
                continue                     # the BOS the tokenizer added itself
            found = raw.find(piece, pos)
            if found < 0:
                log.debug("special token %d not found in the prompt: reuse off", tok)
                self.enabled = False
                self._raw, self._ids = b"", []
                return self.engine.tokenize(text, add_special=self.add_bos,
                                            parse_special=True)
            pos = found + len(piece)
            if tok in self.rstrip:
                continue                     # it ate the whitespace after it: no cut here
            bound_bytes.append(pos)
            bound_toks.append(start_tok + k + 1)
            self._pieces.learn(tok, piece)
        if whole:
            points = list(zip(bound_bytes[keep:], bound_toks[keep:]))
            if pieces_from:
                points.insert(0, (start_byte, start_tok))
            self._pieces.remember(raw, ids, points + [(len(raw), len(ids))])
        self._raw, self._ids = raw, ids
        self._bound_bytes, self._bound_toks = bound_bytes, bound_toks
        return list(ids)


class Projection:
    """Per agent x node; rebuilt from scratch when the dialog was edited."""

    def __init__(self, engine, formatter, node_name: str = "") -> None:
        self.engine = engine
        self.formatter = formatter
        self.node_name = node_name
        self.window_start = 0           # id of the oldest interaction still projected
        self.dialog_version = -1
        self._prefix_key: tuple | None = None
        self._prefix_tokens: list[int] = []
        self._tokenizer = PromptTokenizer(engine, formatter.add_bos)

    def invalidate(self) -> None:
        self.window_start = 0
        self.dialog_version = -1

    def _tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=self.formatter.add_bos,
                                    parse_special=True)

    def build(self, dialog: Dialog, current: Interaction, *, system_prompt: str,
              template_text: str, placement: int, input_text: str, n_ctx: int,
              reserve: int, input_slot: str = "", tools=None, tool_mode: str = "",
              max_history: int | None = None) -> Prompt:
        """tools: a ToolSet whose definitions go into the prompt the way the model's chat
        template expects (the template's `tools`, or a block in the system message).
        max_history: at most this many of the latest earlier interactions (None: all
        that fit)."""
        if dialog.version != self.dialog_version:
            self.window_start = 0
            self.dialog_version = dialog.version
        system = system_prompt
        if placement == Placement.SystemPromptEnd and template_text:
            system = f"{system}\n\n{template_text}" if system else template_text
        head = [{"role": "system", "content": system}] if system else []
        template_tools = None
        if tools is not None:
            head, template_tools = tools.apply(head, tool_mode)
        model = self.engine.model
        user = neutralize(model, input_text)
        if placement == Placement.InPlaceOfUser and template_text:
            # the template replaces the user message (it can say {{user_message}})
            user = template_text
        tail = []
        if placement in _BEFORE_USER and template_text:
            tail.append({"role": _BEFORE_USER[placement], "content": template_text})
        turn = current.messages(user_content=user,
                                skip_slot=input_slot if input_slot != USER_SLOT else None)
        if placement in _AFTER_USER and template_text:
            # right after the user message, before replies earlier nodes gave this turn
            at = next((i + 1 for i, m in enumerate(turn) if m["role"] == "user"), len(turn))
            turn.insert(at, {"role": _AFTER_USER[placement], "content": template_text})
        tail += turn
        summary, covered = dialog.running_summary() if max_history is None else (None, 0)
        pinned = list(head)
        if summary is not None and summary.text:
            pinned.append({"role": "system", "content": f"{SUMMARY_LABEL}\n{summary.text}"})
        history = [i for i in dialog.interactions[covered:]
                   if i is not current and i.id >= self.window_start and i.outcome != "running"]
        if max_history is not None:
            history = history[-max_history:] if max_history > 0 else []

        rendered: dict[int, list] = {}       # window start -> the messages it rendered

        def render(start: int) -> tuple[str, list[int]]:
            msgs = list(pinned)
            for inter in history[start:]:
                for m in inter.messages(template_of=self.node_name or None):
                    if m.pop("_verbatim", False):
                        pass                # the node's own template, as it was sent
                    elif m["role"] == "user":
                        m["content"] = neutralize(model, m["content"])
                    msgs.append(m)
            msgs += tail
            rendered[start] = msgs
            text = self.formatter.render(msgs, add_generation_prompt=True,
                                         tools=template_tools)
            return text, self._tokenizer.tokenize(text)

        high = n_ctx - reserve
        text, tokens = render(0)
        dropped = 0
        if len(tokens) > high:
            target = int(high * KEEP_FRACTION)
            lo, hi = 1, len(history)           # smallest start that fits the target
            best = None
            while lo <= hi:
                mid = (lo + hi) // 2
                t, toks = render(mid)
                if len(toks) <= target:
                    best, hi = (mid, t, toks), mid - 1
                else:
                    lo = mid + 1
            if best is None:
                t, toks = render(len(history))
                if len(toks) > high:
                    raise ProjectionError(
                        f"the prompt needs {len(toks)} tokens without any history, more than "
                        f"the {high} the node has (context size {n_ctx} minus max_tokens "
                        f"{reserve})")
                best = (len(history), t, toks)
            dropped, text, tokens = best
            if dropped < len(history):
                self.window_start = history[dropped].id
            else:
                self.window_start = current.id
        return Prompt(tokens=tokens,
                      shared_prefix_len=self._shared_len(head, tokens, template_tools),
                      text=text, window=len(history) - dropped, dropped=dropped,
                      messages=rendered[dropped], summarized=covered)

    def cacheable_prefix(self, dialog: Dialog, *, n_ctx: int, reserve: int,
                         **args) -> tuple[list[int], int]:
        """The tokens every next prompt of this node starts with, whatever the player says
        (system part, tools, the history window), and how many of them are the shared
        prefix. Found as the common start of two prompts built around different probe
        messages, cut back to just after its last special token (llama.cpp tokenizes the
        text between special tokens on its own, so those tokens cannot change with what
        follows) or to the end of the shared prefix if that is further. Moves the window
        like a real build would."""
        builds = []
        for probe in ("\x01probe-A\x01", "\x02probe-B\x02"):
            current = Interaction(id=dialog.next_id)
            current.add(Component(kind="user", slot=USER_SLOT, text=probe, role="user",
                                  producer="player"))
            builds.append(self.build(dialog, current, input_text=probe, n_ctx=n_ctx,
                                     reserve=reserve, **args))
        a, b = builds[0].tokens, builds[1].tokens
        n = 0
        limit = min(len(a), len(b))
        while n < limit and a[n] == b[n]:
            n += 1
        common = n
        special = self.engine.model.special_tokens
        while n and a[n - 1] not in special:
            n -= 1
        # The shared prefix is checked token for token against the prompts already (and
        # ends on a newline, where vocabularies do not merge): it may end past that cut.
        shared = builds[0].shared_prefix_len
        if shared <= common:
            n = max(n, shared)
        return a[:n], min(shared, n)

    def _shared_len(self, head: list[dict], tokens: list[int], template_tools) -> int:
        if not head and not template_tools:
            return 0
        key = (head[0]["content"] if head else "", repr(template_tools))
        if key != self._prefix_key:
            prefix = self.formatter.stable_prefix(head + [{"role": "user", "content": "x"}],
                                                  tools=template_tools)
            self._prefix_tokens = self._tokenize(prefix.text) if prefix.text else []
            self._prefix_key = key
        # The stable prefix was found with a user message after the system prompt; a prompt
        # whose next message is another (a template placed as a system message before the
        # player's words, a per-character persona) leaves it where the role name starts.
        # Share the tokens the two agree on: identical tokens at identical positions have
        # identical KV, and every agent with this system prompt agrees on the same ones.
        prefix = self._prefix_tokens
        n = 0
        limit = min(len(prefix), len(tokens))
        while n < limit and prefix[n] == tokens[n]:
            n += 1
        return n
