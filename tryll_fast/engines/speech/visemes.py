"""Phoneme -> viseme: the mouth shape each IPA symbol shows, in the 15-viseme set game
engines consume (Oculus/OVR LipSync, which ARKit and most lip-sync rigs map from).

The table is docs/voice.md's, written out here once. A Piper voice's phoneme ids are
mapped once at load (`id_classes`); per sentence the timeline kernel
(`_timeline.cues`) walks the ids with the durations the voice itself predicted in the same
run as the audio, so the cues are where the model put each sound, not a guess from text
length.

Symbols that are not sounds of their own take their time from a neighbour: stress marks
(ˈ ˌ) belong to the sound after them; length marks, diacritics and Piper's padding after
every symbol belong to the sound before; a space (word boundary) too. Punctuation,
the start and end markers are silence (the model pauses there).
"""
from __future__ import annotations

import enum
from typing import Mapping, Sequence

import numpy as np


class Viseme(enum.IntEnum):
    """The wire enum Viseme (schema/messages.fbs), same numbers."""
    Silence = 0
    PP = 1      # p b m
    FF = 2      # f v
    TH = 3      # θ ð
    DD = 4      # t d
    KK = 5      # k g ŋ
    CH = 6      # ʃ ʒ (tʃ dʒ)
    SS = 7      # s z
    NN = 8      # n l
    RR = 9      # ɹ r ɚ
    AA = 10     # ɑ æ ʌ a
    E = 11      # ɛ e ə ɜ
    IH = 12     # ɪ i j
    OH = 13     # ɔ o ɒ
    OU = 14     # u ʊ w


# Not a sound of its own: the time goes to the neighbouring sound.
CARRY_PREVIOUS = -1
CARRY_NEXT = -2

_V = Viseme
TABLE: Mapping[str, int] = {
    # silence: Piper's start / end markers, pauses at punctuation, the glottal stop
    "^": _V.Silence, "$": _V.Silence, "ʔ": _V.Silence,
    **{c: _V.Silence for c in ",.;:!?()\"#↓"},
    # lips together
    "p": _V.PP, "b": _V.PP, "m": _V.PP, "ɓ": _V.PP, "ʙ": _V.PP, "ɱ": _V.FF,
    # lip to teeth
    "f": _V.FF, "v": _V.FF, "ɸ": _V.FF, "β": _V.FF, "ʋ": _V.FF, "ⱱ": _V.FF,
    # tongue between teeth
    "θ": _V.TH, "ð": _V.TH,
    # tongue tip on the ridge
    "t": _V.DD, "d": _V.DD, "ɾ": _V.DD, "ʈ": _V.DD, "ɖ": _V.DD, "ɗ": _V.DD, "ɺ": _V.DD,
    # back of the tongue
    "k": _V.KK, "ɡ": _V.KK, "g": _V.KK, "q": _V.KK, "ɢ": _V.KK, "ŋ": _V.KK, "ɴ": _V.KK,
    "x": _V.KK, "ɣ": _V.KK, "χ": _V.KK, "ɠ": _V.KK, "ɰ": _V.KK, "c": _V.KK, "ɟ": _V.KK,
    "ʛ": _V.KK,
    # rounded, pushed-forward lips with teeth close (sh, zh, ch, j)
    "ʃ": _V.CH, "ʒ": _V.CH, "ɕ": _V.CH, "ʑ": _V.CH, "ʂ": _V.CH, "ʐ": _V.CH, "ç": _V.CH,
    "ʝ": _V.CH, "ɧ": _V.CH,
    # teeth together
    "s": _V.SS, "z": _V.SS, "ɬ": _V.SS, "ɮ": _V.SS,
    # tongue up, mouth a little open
    "n": _V.NN, "l": _V.NN, "ɫ": _V.NN, "ɲ": _V.NN, "ɳ": _V.NN, "ɭ": _V.NN, "ʎ": _V.NN,
    "ʟ": _V.NN,
    # r sounds and r-coloured vowels
    "ɹ": _V.RR, "r": _V.RR, "ɻ": _V.RR, "ɽ": _V.RR, "ʀ": _V.RR, "ʁ": _V.RR, "ɚ": _V.RR,
    "˞": CARRY_PREVIOUS,
    # open vowels
    "a": _V.AA, "ɑ": _V.AA, "æ": _V.AA, "ʌ": _V.AA, "ɐ": _V.AA, "ɶ": _V.AA, "ħ": _V.AA,
    "ʕ": _V.AA, "ʢ": _V.AA, "ʡ": _V.AA,
    # mid front and central vowels
    "e": _V.E, "ɛ": _V.E, "ə": _V.E, "ɜ": _V.E, "ɘ": _V.E, "œ": _V.E, "ɞ": _V.E,
    "ε": _V.E, "ɤ": _V.E,
    # close front vowels and the y glide
    "i": _V.IH, "ɪ": _V.IH, "ɨ": _V.IH, "ᵻ": _V.IH, "j": _V.IH, "y": _V.IH, "ʏ": _V.IH,
    "ɥ": _V.IH, "ø": _V.IH,
    # rounded mid vowels
    "o": _V.OH, "ɔ": _V.OH, "ɒ": _V.OH, "ɵ": _V.OH,
    # rounded close vowels and the w glide
    "u": _V.OU, "ʊ": _V.OU, "w": _V.OU, "ʉ": _V.OU, "ɯ": _V.OU, "ʍ": _V.OU,
    # h takes the shape of the vowel it breathes into
    "h": CARRY_NEXT, "ɦ": CARRY_NEXT, "ʜ": CARRY_NEXT,
    # stress belongs to the next sound; length, diacritics, padding and word gaps to the
    # previous one
    "ˈ": CARRY_NEXT, "ˌ": CARRY_NEXT,
    "ː": CARRY_PREVIOUS, "ˑ": CARRY_PREVIOUS, "ʰ": CARRY_PREVIOUS, "ʲ": CARRY_PREVIOUS,
    "ˤ": CARRY_PREVIOUS, "_": CARRY_PREVIOUS, " ": CARRY_PREVIOUS, "-": CARRY_PREVIOUS,
    "'": CARRY_PREVIOUS,
    "\u0327": CARRY_PREVIOUS, "\u0303": CARRY_PREVIOUS, "\u032a": CARRY_PREVIOUS,
    "\u032f": CARRY_PREVIOUS, "\u0329": CARRY_PREVIOUS,
    # clicks: the tongue, lips mostly closed
    "ǀ": _V.DD, "ǁ": _V.NN, "ǂ": _V.DD, "ǃ": _V.DD, "ʘ": _V.PP, "ʄ": _V.CH,
}


def id_classes(phoneme_id_map: Mapping[str, Sequence[int]], n_symbols: int) -> np.ndarray:
    """int8[n_symbols]: each phoneme id's viseme, or a CARRY_* class. Ids of symbols the
    table does not know (digits, a voice's extra symbols) carry the previous sound."""
    out = np.full(n_symbols, CARRY_PREVIOUS, dtype=np.int8)
    for symbol, ids in phoneme_id_map.items():
        cls = TABLE.get(symbol, CARRY_PREVIOUS)
        for i in ids:
            if 0 <= i < n_symbols:
                out[i] = cls
    return out
