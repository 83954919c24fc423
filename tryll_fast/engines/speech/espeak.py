"""Text -> IPA phonemes with eSpeak NG, the phonemizer Piper voices were trained on.

The library and its data come from the `espeakng-loader` wheel (no system package) and are
driven through ctypes. eSpeak keeps one global state (voice, buffers), so every call holds
one process-wide lock; a sentence takes about a millisecond.

`espeak_TextToPhonemes` returns one clause per call and drops the punctuation that ended
it, which Piper voices use for prosody (a comma pauses, a question rises). So the text is
cut at clause punctuation first, each piece is phonemized, and the punctuation mark is put
back after its clause's phonemes, as Piper's own phonemizer does.
"""
from __future__ import annotations

import ctypes
import re
import threading
import unicodedata

from tryll_fast.engines.errors import ModelLoadError

# espeak_AUDIO_OUTPUT: AUDIO_OUTPUT_SYNCHRONOUS (no audio device is ever opened)
_AUDIO_OUTPUT_SYNCHRONOUS = 2
# espeakINITIALIZE_DONT_EXIT: return an error instead of calling exit() on a fatal one
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_PHONEMES_IPA = 0x02

# Clause punctuation Piper voices have symbols for; runs like "?!" or "..." keep the last.
_CLAUSE = re.compile(r"([,.;:!?]+|[\u2026\u2014\u2013]+)")
# What the clause marks become in the phoneme string ("…" ends like ".", dashes pause).
_MARK = {"\u2026": ".", "\u2014": ",", "\u2013": ","}
# Control characters (and eSpeak's own markup openers) never reach the library.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f<>]")

_lock = threading.Lock()
_lib = None
_voice = None


def _library():
    """Load and initialise libespeak-ng once (under _lock)."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        import espeakng_loader
    except ImportError as exc:
        raise ModelLoadError("the phonemizer needs the espeakng-loader package "
                             "(pip install espeakng-loader)") from exc
    try:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
    except OSError as exc:
        raise ModelLoadError(f"cannot load libespeak-ng: {exc}") from exc
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                      ctypes.c_int]
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByName.restype = ctypes.c_int
    lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                          ctypes.c_int]
    lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0,
                                 espeakng_loader.get_data_path().encode(),
                                 _INITIALIZE_DONT_EXIT)
    if rate <= 0:
        raise ModelLoadError(f"espeak_Initialize failed ({rate})")
    _lib = lib
    return lib


def warm() -> None:
    """Load the library now (a session's engine hint, or a voice loading)."""
    with _lock:
        _library()


def check_voice(voice: str) -> None:
    """Raise ModelLoadError if eSpeak has no voice of that name (e.g. "en-us")."""
    with _lock:
        _select(_library(), voice)


def _select(lib, voice: str) -> None:
    global _voice
    if voice == _voice:
        return
    if lib.espeak_SetVoiceByName(voice.encode("ascii", "replace")) != 0:
        raise ModelLoadError(f"eSpeak has no voice {voice!r}")
    _voice = voice


def _clause(lib, text: str) -> str:
    buf = ctypes.create_string_buffer(text.encode("utf-8"))
    ptr = ctypes.c_void_p(ctypes.addressof(buf))
    words = []
    # Each call consumes one clause and moves ptr on; NULL when the text is used up.
    while ptr.value:
        out = lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, _PHONEMES_IPA)
        if out:
            words.append(out.decode("utf-8", "replace").strip())
    return " ".join(w for w in words if w)


def phonemize(text: str, voice: str) -> str:
    """IPA phonemes of `text` in eSpeak voice `voice`, clause punctuation kept, words
    separated by spaces, NFD-normalised (Piper's phoneme maps are per code point)."""
    text = _UNSAFE.sub(" ", text)
    parts = _CLAUSE.split(text)
    out: list[str] = []
    with _lock:
        lib = _library()
        _select(lib, voice)
        for i in range(0, len(parts), 2):
            piece = parts[i].strip()
            if piece:
                phonemes = _clause(lib, piece)
                if phonemes:
                    if out and out[-1] not in (" ",):
                        out.append(" ")
                    out.append(phonemes)
            if i + 1 < len(parts) and out:
                mark = parts[i + 1][-1]
                out.append(_MARK.get(mark, mark))
    return unicodedata.normalize("NFD", "".join(out).strip())
