"""Word error rate, for the tests that hear the voice back (speech made by the TTS voice,
transcribed by Whisper): words normalised to lower-case letters and apostrophes, then the
word-level edit distance."""
from __future__ import annotations

import re


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]
