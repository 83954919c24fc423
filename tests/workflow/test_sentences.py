"""The sentence splitter of the speaking nodes: where text is cut, and that feeding it in
any pieces gives the same chunks and loses nothing."""
import re

from hypothesis import given, settings, strategies as st

from tryll_fast.workflow.sentences import MAX_CHUNK_CHARS, SentenceSplitter, speakable


def split(text, pieces=None, **kw):
    s = SentenceSplitter(**kw)
    out = []
    if pieces is None:
        out += s.feed(text)
    else:
        i = 0
        for n in pieces:
            out += s.feed(text[i:i + n])
            i += n
        out += s.feed(text[i:])
    return out + s.flush()


def test_sentences_end_at_terminal_punctuation_followed_by_space():
    assert split("Hello there, friend! Sit down. What will it be?") == [
        "Hello there, friend!", "Sit down. What will it be?"]      # "Sit down." < 12
    assert split("Wait... what?! Really?  Yes.\nNew line", min_sentence_chars=1) == [
        "Wait...", "what?!", "Really?", "Yes.", "New line"]


def test_no_cut_inside_numbers_abbreviations_and_initials():
    text = "Dr. Smith paid 3.5 gold to J. R. Tolkien, e.g. for a map. Then he left."
    assert split(text) == ["Dr. Smith paid 3.5 gold to J. R. Tolkien, e.g. for a map.",
                           "Then he left."]


def test_closing_quotes_stay_with_their_sentence():
    assert split('She said "Run!" and then "Hide." Now we wait here.') == [
        'She said "Run!"', 'and then "Hide."', "Now we wait here."]


def test_short_sentences_merge_with_the_next():
    assert split("Yes. No. Maybe so, traveller.", min_sentence_chars=12) == [
        "Yes. No. Maybe so, traveller."]
    assert split("Yes. No. Maybe so, traveller.", min_sentence_chars=1) == [
        "Yes.", "No.", "Maybe so, traveller."]


def test_the_first_chunk_is_cut_at_a_clause_or_a_word():
    text = ("Well, traveller, the road to the northern keep winds through the old forest "
            "where the wolves hunt at night. Beware.")
    out = split(text, first_chunk_max_chars=30)
    assert out[0] == "Well, traveller," and len(out[0]) <= 30
    out = split("Aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii.", first_chunk_max_chars=20)
    assert out[0] == "Aaaa bbbb cccc dddd" and out[1] == "eeee ffff gggg hhhh iiii."
    # only the first chunk is capped
    assert all(len(c) <= MAX_CHUNK_CHARS for c in out)


def test_the_first_chunk_ends_at_its_first_clause_when_capped():
    text = "Ah, a room for the night costs 2 silver pieces, supper included. Bath extra."
    # "Ah," is shorter than min_sentence_chars; the next clause mark ends the chunk, long
    # before the sentence does
    assert split(text, first_chunk_max_chars=60) == [
        "Ah, a room for the night costs 2 silver pieces,", "supper included.", "Bath extra."]
    assert split(text) == ["Ah, a room for the night costs 2 silver pieces, supper included.",
                           "Bath extra."]                  # no cap: sentences only
    # a comma inside a number is no clause; one past the cap is left to the cap's cut
    assert split("It costs 1,000 gold coins, friend, no less.", first_chunk_max_chars=40)[0] \
        == "It costs 1,000 gold coins,"
    assert split("A very long opening clause without a mark, then more.",
                 first_chunk_max_chars=20)[0] == "A very long opening"


def test_a_sentence_that_never_ends_is_cut_at_the_cap():
    text = " ".join(["word"] * 300)
    out = split(text)
    assert all(len(c) <= MAX_CHUNK_CHARS for c in out) and len(out) >= 3
    assert " ".join(out).split() == text.split()
    blob = "x" * 1000                                   # one endless word
    assert "".join(split(blob)) == blob


def test_speakable_drops_markup():
    assert speakable("*smiles* Hello,   **friend**!\n# Menu") == "smiles Hello, friend! Menu"


PROSE = st.lists(st.sampled_from([
    "Hello", "there", "friend", "3.5", "Dr.", "J.", "e.g.", "gold", "Sit", "down.", "Run!",
    "What?", "Well,", "the", "road...", '"Hide."', "wolves", "\n", "ok", "x" * 30, "—",
]), max_size=80).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(text=PROSE, pieces=st.lists(st.integers(1, 7), max_size=60),
       min_chars=st.integers(1, 40), first=st.sampled_from([0, 20, 50]))
def test_pieces_do_not_change_the_chunks_and_nothing_is_lost(text, pieces, min_chars, first):
    whole = split(text, min_sentence_chars=min_chars, first_chunk_max_chars=first)
    streamed = split(text, pieces, min_sentence_chars=min_chars, first_chunk_max_chars=first)
    assert streamed == whole
    squash = lambda s: re.sub(r"\s+", "", s)           # noqa: E731
    assert squash("".join(whole)) == squash(text)
    assert all(c == c.strip() and c for c in whole)
    assert all(len(c) >= min_chars for c in whole[:-1] if len(c) < MAX_CHUNK_CHARS
               and not (first and c is whole[0]))


# ---- replies the token budget cut off end at their last complete sentence

def test_complete_sentences_cut_after_the_last_finished_sentence():
    from tryll_fast.workflow.sentences import complete_sentences, sentence_end
    cut = "Welcome to the Pony! Rooms are 2 silver. Well, I reckon the"
    assert complete_sentences(cut) == "Welcome to the Pony! Rooms are 2 silver."
    assert complete_sentences("It costs 3.5 coins. Mr. Reed is") == "It costs 3.5 coins."
    assert complete_sentences("A whole reply.") == "A whole reply."
    assert complete_sentences("one long clause with no end") == "one long clause with no end"
    assert sentence_end("It costs 3.", final=False) == 0      # "3." may be "3.5"
    assert sentence_end("It costs 3.") == len("It costs 3.")


def test_splitter_drops_the_unfinished_sentence_of_a_cut_reply():
    s = SentenceSplitter(min_sentence_chars=12)
    spoken = s.feed("Welcome, traveller! Sit by the fire. Ale? Well, I reckon the")
    assert spoken == ["Welcome, traveller!", "Sit by the fire."]
    assert s.flush(complete_only=True) == ["Ale?"]         # short, waiting for a merge
    s = SentenceSplitter(min_sentence_chars=12)
    s.feed("Welcome, traveller! Sit by the fire. Ale? Well, I reckon the")
    assert s.flush() == ["Ale? Well, I reckon the"]


class _Sink:
    def __init__(self):
        self.chunks = []

    def feed(self, text):
        self.chunks.append(text)


@given(st.lists(st.integers(1, 6), min_size=1, max_size=40), st.integers(2, 60),
       st.booleans())
@settings(max_examples=200, deadline=None)
def test_tail_guard_streams_what_the_dialog_keeps(pieces, max_tokens, cut):
    """Whatever the chunking, the text streamed equals the text kept: all of it when the
    reply ended on its own, up to the last full sentence when the budget cut it (unless
    that sentence began before half the budget, whose chunks went out at once)."""
    from tryll_fast.workflow.sentences import TailGuard, complete_sentences
    text = "Hello there, friend! The rye is 3.5 copper. Tomas Reed... he is away. Well, I"
    sink = _Sink()
    guard = TailGuard(sink, max_tokens)
    i = early = 0
    for k, n in enumerate(pieces):
        before = len(sink.chunks)
        guard.feed(text[i:i + n])
        if k < max_tokens // 2 and text[i:i + n]:
            assert len(sink.chunks) == before + 1       # passed at once
            early = min(i + n, len(text))
        i += n
    guard.feed(text[i:])
    if len(pieces) < max_tokens // 2:
        early = len(text)
    guard.finish(cut)
    expected = text[:max(len(complete_sentences(text)), early)] if cut else text
    assert "".join(sink.chunks) == expected


def _through_thought_filter(chunks):
    from tryll_fast.workflow.sentences import ThoughtFilter
    out = []
    f = ThoughtFilter(out.append)
    for c in chunks:
        f.feed(c)
    f.flush()
    return "".join(out)


REPLY_WITH_THOUGHT = "<think>\nThe traveller asks the price. It is 2 silver.\n</think>\n\nTwo silver."


@given(st.lists(st.integers(min_value=1, max_value=len(REPLY_WITH_THOUGHT) - 1), max_size=12))
@settings(max_examples=200, deadline=None)
def test_a_chain_of_thought_never_reaches_the_player_however_it_is_chunked(cuts):
    cuts = sorted(set(cuts))
    chunks = [REPLY_WITH_THOUGHT[a:b] for a, b in
              zip([0, *cuts], [*cuts, len(REPLY_WITH_THOUGHT)])]
    assert _through_thought_filter(chunks) == "Two silver."


def test_a_reply_without_a_thought_passes_whole():
    assert _through_thought_filter(["Hello", " there."]) == "Hello there."
    assert _through_thought_filter(["<", "b>bold</b>"]) == "<b>bold</b>"   # not the tag
    assert _through_thought_filter(["<thi"]) == "<thi"         # ended before it was one
    assert _through_thought_filter(["<think>still thinking"]) == ""   # cut off mid-thought
