"""Word error rate, for the tests that hear the voice back (speech made by the TTS voice,
transcribed by Whisper): words normalised to lower-case letters and apostrophes, then the
word-level edit distance."""
from __future__ import annotations

import re

# Lines an NPC might say, for the tests that speak and hear them back
SPOKEN_LINES = [
    "Welcome to the tavern, friend. Sit down by the fire.",
    "The road to the northern keep is dangerous at night.",
    "I have fresh bread, apple pie and a pot of hot soup.",
    "The blacksmith lives next to the old stone bridge.",
    "Please keep your voice down, the guards are listening.",
    "My brother went into the forest and never came back.",
    "Bring me three wolf pelts and I will pay you well.",
    "The king has raised the taxes again this winter.",
    "Do not trust the merchant with the green hat.",
    "We close the doors when the bell rings at midnight.",
    "The river is frozen, so the boats cannot leave the harbor.",
    "Thank you for your help, you are always welcome here.",
]


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
