"""Streamed text -> speakable chunks for a speaking node (docs/voice.md, "Sentences").

A chunk ends at a sentence boundary: . ! ? or … (a run of them, then any closing quotes or
brackets) followed by whitespace, or a line break. A period after a known abbreviation
("Dr.", "e.g.") or a single letter (an initial) is not a boundary, and a period between
digits never is (the next character has to be whitespace). Then:
- a chunk shorter than `min_sentence_chars` waits and is merged with the next one;
- with `first_chunk_max_chars` set (0 = no cap), the node's first chunk ends at its first
  clause mark (, ; : — followed by whitespace) at least `min_sentence_chars` and at most
  the cap into the text, so the first audio comes as soon as the first clause is written
  ("Ah, well, a room is 2 silver, supper included." speaks "Ah, well, a room is 2 silver,"
  first); without one, it is cut at the cap, at the last clause mark before it, else the
  last space, and what is left after that cut is at least `min_sentence_chars` long;
- any chunk is cut at MAX_CHUNK_CHARS the same way (a model that never ends a sentence
  must not hold the voice back);
- `flush()` returns the rest when the text is complete.
Feeding is incremental: each call scans only the new text.
"""
from __future__ import annotations

import re

MAX_CHUNK_CHARS = 400
_ENDS = ".!?\u2026"
_CLOSERS = "\"')]}\u201d\u2019\u00bb"
_CLAUSE_MARKS = ",;:\u2014\u2013"
_ABBREVIATIONS = frozenset({
    "mr", "mrs", "ms", "dr", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "mt",
    "prof", "capt", "gen", "lt", "sgt", "col", "fig", "approx", "dept", "est", "vol",
})
# Characters that mark up text for the eye, not the ear (markdown emphasis, headings).
_UNSPOKEN = re.compile(r"[*_#~`]+")
_SPACES = re.compile(r"\s+")


def speakable(text: str) -> str:
    """What the voice reads: markup characters removed, whitespace collapsed."""
    return _SPACES.sub(" ", _UNSPOKEN.sub("", text).replace("|", " ")).strip()


class SentenceSplitter:
    def __init__(self, min_sentence_chars: int = 12, first_chunk_max_chars: int = 0,
                 max_chunk_chars: int = MAX_CHUNK_CHARS) -> None:
        self.min_chars = max(1, int(min_sentence_chars))
        self.first_max = max(0, int(first_chunk_max_chars))
        self.max_chars = max(self.min_chars, int(max_chunk_chars))
        self._buf = ""
        self._scan = 0              # boundaries before this index were already examined
        self.emitted = 0

    def feed(self, text: str) -> list[str]:
        """Add streamed text; return the chunks it completed (possibly none)."""
        if not text:
            return []
        buf = self._buf + text
        i = self._scan
        lead = len(buf) - len(buf.lstrip())
        if lead:                        # chunks never start with whitespace
            buf = buf[lead:]
            i = max(0, i - lead)
        out: list[str] = []
        n = len(buf)
        while i < n:
            c = buf[i]
            end = -1
            if c == "\n":
                end = i + 1
            elif c in _ENDS:
                j = _past_terminator(buf, i)
                if j >= n:
                    break               # the next character decides; wait for it
                if buf[j].isspace() and not (c == "." and _abbreviation(buf, i)):
                    end = j
                i = j - 1
            elif c in _CLAUSE_MARKS and self.min_chars <= i + 1 <= self.first_max \
                    and self.emitted + len(out) == 0:
                if i + 1 >= n:
                    break               # "1," may be "1,000"; wait for the next character
                if buf[i + 1].isspace():
                    end = i + 1         # the first chunk ends at its first clause
            if end > 0:
                chunk = buf[:end]
                if len(chunk.strip()) >= self.min_chars:
                    out.extend(self._limited(chunk, len(out)))
                    buf = buf[end:].lstrip()
                    n = len(buf)
                    i = 0
                    continue
            i += 1
        self._buf = buf
        self._scan = min(i, len(buf))
        out.extend(self._cap(len(out)))
        out = [s for s in (c.strip() for c in out) if s]
        self.emitted += len(out)
        return out

    def flush(self, complete_only: bool = False) -> list[str]:
        """The rest of the text (the generation ended). complete_only: the reply ran out
        of tokens, so its unfinished last sentence is dropped, not spoken."""
        rest = self._buf
        if complete_only:
            rest = rest[:sentence_end(rest)]
        self._buf = ""
        self._scan = 0
        out = [s for s in (c.strip() for c in self._limited(rest, 0)) if s]
        self.emitted += len(out)
        return out

    def _limit_of(self, done: int) -> int:
        """The cap of the next chunk (`done` chunks completed by this call so far)."""
        if self.first_max and self.emitted + done == 0:
            return self.first_max
        return self.max_chars

    def _cut(self, text: str, limit: int) -> int:
        """Where to cut `text`: after the last clause mark at or before `limit`, else at
        the last space; -1 when neither leaves min_sentence_chars before it."""
        head = text[:limit]
        cut = max(head.rfind(m) for m in _CLAUSE_MARKS) + 1
        if cut < self.min_chars:
            cut = head.rfind(" ")
            if cut < self.min_chars:
                return -1
        return cut

    # A chunk over its cap is cut at the last boundary under the cap, keeping at least
    # min_sentence_chars after the cut (a sentence does not end in a stray word). A complete
    # chunk (_limited) and a growing one (_cap) are cut at the same places: the growing one
    # is cut only once it is cap + min_sentence_chars long, when the complete one is sure to
    # be cut there too, so streamed text gives the same chunks however it is split.

    def _limited(self, chunk: str, done: int) -> list[str]:
        """A complete chunk, cut into pieces under their caps."""
        out = []
        while True:
            cap = self._limit_of(done + len(out))
            size = len(chunk.rstrip())
            if size <= cap:
                out.append(chunk)
                return out
            cut = self._cut(chunk, min(cap, size - self.min_chars))
            if cut < 0:
                if size < self.max_chars + self.min_chars:
                    out.append(chunk)   # no boundary under the first cap: keep it whole
                    return out
                cut = self._cut(chunk, self.max_chars)
                if cut < 0:
                    cut = self.max_chars    # one endless word: cut it anyway
            out.append(chunk[:cut])
            chunk = chunk[cut:].lstrip()

    def _cap(self, done: int) -> list[str]:
        """The incomplete sentence in the buffer, cut while it is over its cap."""
        out = []
        while True:
            cap = self._limit_of(done + len(out))
            size = len(self._buf.rstrip())
            if size < cap + self.min_chars:
                return out              # where it ends still decides
            cut = self._cut(self._buf, cap)
            if cut < 0:
                if size < self.max_chars + self.min_chars:
                    return out
                cut = self._cut(self._buf, self.max_chars)
                if cut < 0:
                    cut = self.max_chars
            out.append(self._buf[:cut])
            self._buf = self._buf[cut:].lstrip()
            self._scan = 0


def sentence_end(text: str, final: bool = True) -> int:
    """Where the last complete sentence of `text` ends (0: none does): after a boundary
    as the splitter finds them. final: the text is complete, so its end counts as
    whitespace; otherwise a terminator at the very end waits for the next character
    ("3." may be "3.5")."""
    last = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            last = i + 1
        elif c in _ENDS:
            j = _past_terminator(text, i)
            if ((text[j].isspace() if j < n else final)
                    and not (c == "." and _abbreviation(text, i))):
                last = j
            i = j - 1
        i += 1
    return last


def complete_sentences(text: str) -> str:
    """`text` up to its last complete sentence; all of it when no sentence ends in it
    (a reply that is one unfinished sentence is still better shown than dropped)."""
    end = sentence_end(text)
    return text[:end].rstrip() if end else text


class TailGuard:
    """Holds a streamed reply's unfinished sentence back once the reply has used half its
    token budget, so a reply the budget cuts off never shows its broken last sentence
    (docs/workflow.md, "Replies that end like speech"). Before that point every chunk
    passes at once: the first token costs nothing. Sits between the engine's on_text and
    the node's AnswerStream, on the engine's thread."""

    __slots__ = ("stream", "start_at", "held", "tokens", "text")

    def __init__(self, stream, max_tokens: int) -> None:
        self.stream = stream
        self.start_at = max_tokens // 2
        self.held = ""
        self.tokens = 0
        self.text = ""                  # everything fed

    def feed(self, text: str) -> None:
        self.tokens += 1                # one on_text call a sampled token (or fewer)
        self.text += text
        if self.tokens <= self.start_at and not self.held:
            self.stream.feed(text)
            return
        held = self.held + text
        end = sentence_end(held, final=False)
        if end:
            self.stream.feed(held[:end])
            held = held[end:]
        self.held = held

    def finish(self, cut: bool) -> None:
        """The generation ended: the held text goes out; when the budget cut the reply,
        only as far as complete_sentences() keeps it in the dialog."""
        sent = len(self.text) - len(self.held)
        keep = complete_sentences(self.text) if cut else self.text
        if len(keep) > sent:
            self.stream.feed(keep[sent:])
        self.held = ""


def _past_terminator(text: str, i: int) -> int:
    """Just past the terminator at text[i]: the run of terminators, then closing quotes and
    brackets ("Really?!" or "...fine.")."""
    j, n = i + 1, len(text)
    while j < n and text[j] in _ENDS:
        j += 1
    while j < n and text[j] in _CLOSERS:
        j += 1
    return j


def _abbreviation(buf: str, dot: int) -> bool:
    """The word before the period at `dot` is an abbreviation or an initial."""
    start = dot
    while start > 0 and not (buf[start - 1].isspace() or buf[start - 1] in "\"'([{"):
        start -= 1
    word = buf[start:dot].lower()
    if not word:
        return False
    if len(word) == 1 and word.isalpha():
        return True                     # an initial: "J. R. R. Tolkien"
    return word in _ABBREVIATIONS


class ThoughtFilter:
    """Keeps a reasoning model's chain of thought (a reply that opens with <think>, up to
    its </think>) out of what is shown and spoken: the text after it passes on to `sink`,
    leading whitespace dropped. A reply that does not open with the tag passes at once, but
    for the few characters that could still be its start. On the engine's thread; `flush()`
    once the generation has ended."""

    __slots__ = ("sink", "state", "buf")
    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, sink) -> None:
        self.sink = sink
        self.state = "start"            # start | thinking | after | pass
        self.buf = ""

    def feed(self, text: str) -> None:
        if self.state == "pass":
            self.sink(text)
            return
        self.buf += text
        if self.state == "start":
            head = self.buf.lstrip()
            if not head or self.OPEN.startswith(head):
                return                  # could still be the opening tag
            if not head.startswith(self.OPEN):
                self.state, out, self.buf = "pass", self.buf, ""
                self.sink(out)
                return
            self.state, self.buf = "thinking", head[len(self.OPEN):]
        if self.state == "thinking":
            end = self.buf.find(self.CLOSE)
            if end < 0:
                return
            self.state, self.buf = "after", self.buf[end + len(self.CLOSE):]
        rest = self.buf.lstrip()
        if rest:
            self.state, self.buf = "pass", ""
            self.sink(rest)

    def flush(self) -> None:
        """The generation ended: a held start that never became the tag goes out."""
        if self.state == "start" and self.buf:
            out, self.buf, self.state = self.buf, "", "pass"
            self.sink(out)
