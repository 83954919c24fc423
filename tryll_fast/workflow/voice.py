"""An agent's voice: the VoiceProfile checked against its model, and the active delivery mode.

Rules (docs/voice.md; 3023 InvalidVoiceProfile names the field and the rule):
- no profile, or an empty model_name, is fine while no node speaks (the profile is stored,
  nothing is loaded); a speaking graph without a profile is 3025 AgentVoiceRequired, with
  an empty model_name 3023;
- model_name: a catalog entry of the tts role whose engine this build runs; a speaking
  graph also needs it downloaded (3003, as for language models: CreateAgent never
  downloads);
- speaker_id < the model's advertised speakers; speaker_name only on models with named
  speakers; speed finite in 0.25..4 (and 1 on a model without speed control);
- language: empty = the session locale when the model speaks it, else the model's own
  first language; a non-empty tag must be one the model speaks (primary subtag match);
- description, reference clips and delivery instructions only on models with those
  capabilities (TtsCapabilitiesInfo): a profile the model cannot honour is refused, not
  silently spoken in another voice;
- delivery modes: names non-empty, unique, not "neutral"; speed_multiplier finite > 0,
  keeping the effective speed within 0.25..4; default_delivery_mode empty or a mode's name.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import langcodes

from tryll_fast.errors import ErrorCode, TryllError

NEUTRAL = "neutral"
MIN_SPEED, MAX_SPEED = 0.25, 4.0
MAX_MODES = 64
MAX_NAME_CHARS = 64
MAX_TEXT_CHARS = 4096


@dataclass(frozen=True)
class DeliveryMode:
    name: str
    instruction: str
    speed_multiplier: float


@dataclass(frozen=True)
class Voice:
    """A checked VoiceProfile. `model` is "" for a stored-only profile."""
    model: str
    speaker_id: int
    speed: float
    language: str
    modes: Mapping[str, DeliveryMode]
    default_mode: str
    emit_visemes: bool
    profile: Any = field(compare=False, repr=False)    # the VoiceProfile as received

    def mode_for(self, name: str) -> str:
        """The mode a SetAgentVoice keeps: `name` if this voice has it, else its default."""
        return name if name in self.modes else self.default_mode


class DeliveryState:
    """The agent's active delivery mode and intensity: set at any time
    (SetAgentDeliveryMode, reactor thread), read once per sentence (speech thread)."""

    def __init__(self, mode: str = "", intensity: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._value = (mode, intensity)

    def set(self, mode: str, intensity: float) -> None:
        with self._lock:
            self._value = (mode, intensity)

    def get(self) -> tuple[str, float]:
        with self._lock:
            return self._value


def length_scale(voice: Voice, mode: str, intensity: float) -> float:
    """The synthesis length scale for one sentence: 1 / (speed x the mode's multiplier at
    that intensity); neutral (or an unknown mode) is the profile's own speed."""
    speed = voice.speed
    m = voice.modes.get(mode)
    if m is not None:
        speed *= 1.0 + (m.speed_multiplier - 1.0) * intensity
    return 1.0 / max(speed, 1e-3)


def clamp_intensity(x: float) -> float:
    if not math.isfinite(x):
        return 1.0
    return min(1.0, max(0.0, float(x)))


def speaks_language(entry, tag: str) -> bool:
    """The model speaks `tag` (matched on the primary language subtag: "en" = "en-GB")."""
    want = tag.split("-")[0].lower()
    return any(lang.split("-")[0].lower() == want for lang in entry.languages)


def check_voice(profile, *, speaks: bool, catalog, engines: set[str],
                downloaded: Callable[[str], bool], locale: str) -> Voice | None:
    """Check `profile` (a codec VoiceProfile or None) for an agent whose graph does or
    does not speak. Returns the Voice, or None when there is no profile."""
    if profile is None:
        if speaks:
            raise TryllError(ErrorCode.AgentVoiceRequired,
                             "a node of the graph speaks (Speak / GenerateAndSpeak) and the "
                             "agent has no voice: set CreateAgentRequest.voice")
        return None

    def bad(where: str, problem: str) -> TryllError:
        return TryllError(ErrorCode.InvalidVoiceProfile, f"voice.{where}: {problem}")

    name = profile.model_name or ""
    entry = None
    if not name:
        if speaks:
            raise bad("model_name", "empty; a node of the graph speaks, so the voice needs a "
                                    "text-to-speech model")
    else:
        entry = catalog.get(name)
        if entry is None:
            tts = ", ".join(e.name for e in catalog.visible() if e.role == "tts") or "none"
            raise bad("model_name", f"{name!r} is not in the model catalog (voices: {tts})")
        if entry.role != "tts":
            raise bad("model_name", f"{name!r} is a {entry.role} model, not a voice (tts)")
        if entry.engine not in engines:
            raise TryllError(ErrorCode.EngineNotAvailable,
                             f"voice.model_name: {name!r} (role {entry.role}) runs on engine "
                             f"{entry.engine}, which this server build does not have",
                             model=name, role=entry.role, engine=entry.engine)
        if speaks and not downloaded(name):
            raise TryllError(ErrorCode.GraphCompilationFailed,
                             f"voice.model_name: {name!r} is not downloaded; download it "
                             "first (DownloadModelRequest): CreateAgent never downloads")
    caps: Mapping[str, Any] = entry.capabilities if entry is not None else {}

    speakers = int(caps.get("num_speakers", 0))
    if profile.speaker_id < 0:
        raise bad("speaker_id", f"{profile.speaker_id} is negative")
    if speakers > 0 and profile.speaker_id >= speakers:
        raise bad("speaker_id", f"{profile.speaker_id}: model {name!r} has {speakers} "
                                f"speaker(s), ids 0..{speakers - 1}")
    if profile.speaker_name and entry is not None and speakers <= 1:
        raise bad("speaker_name", f"{profile.speaker_name!r}: model {name!r} has no named "
                                  "speakers")
    speed = profile.speed
    if not math.isfinite(speed) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise bad("speed", f"{speed!r} is outside {MIN_SPEED}..{MAX_SPEED} (1 = natural)")
    if entry is not None and speed != 1.0 and not caps.get("supports_speed", False):
        raise bad("speed", f"{speed:g}: model {name!r} has no speed control (use 1)")

    language = profile.language or ""
    if language:
        if len(language) > 64 or not langcodes.tag_is_valid(language):
            raise bad("language", f"{language!r} is not a BCP-47 language tag")
        if entry is not None and entry.languages and not speaks_language(entry, language):
            raise bad("language", f"{language!r}: model {name!r} speaks "
                                  f"{', '.join(entry.languages)}")
    elif entry is not None:
        if locale and (not entry.languages or speaks_language(entry, locale)):
            language = locale
        elif entry.languages:
            language = entry.languages[0]
    else:
        language = locale

    for field_name, cap in (("description", "supports_voice_description"),
                            ("reference_clip_path", "supports_reference_clip")):
        value = getattr(profile, field_name) or ""
        if len(value) > MAX_TEXT_CHARS:
            raise bad(field_name, f"{len(value)} characters; at most {MAX_TEXT_CHARS}")
        if value and entry is not None and not caps.get(cap, False):
            raise bad(field_name, f"model {name!r} does not support it ({cap} is false)")
    if profile.reference_clip_text and not profile.reference_clip_path:
        raise bad("reference_clip_text", "set without reference_clip_path")

    modes: dict[str, DeliveryMode] = {}
    raw_modes = list(profile.delivery_modes)
    if len(raw_modes) > MAX_MODES:
        raise bad("delivery_modes", f"{len(raw_modes)} modes; at most {MAX_MODES}")
    for i, m in enumerate(raw_modes):
        where = f"delivery_modes[{i}]"
        mode_name = m.name or ""
        if not mode_name:
            raise bad(f"{where}.name", "empty: every delivery mode needs a name")
        if len(mode_name) > MAX_NAME_CHARS:
            raise bad(f"{where}.name", f"{len(mode_name)} characters; at most "
                                       f"{MAX_NAME_CHARS}")
        if mode_name == NEUTRAL:
            raise bad(f"{where}.name", f"{NEUTRAL!r} is reserved for the plain voice")
        if mode_name in modes:
            raise bad(f"{where}.name", f"{mode_name!r} is used twice")
        mult = m.speed_multiplier
        if not math.isfinite(mult) or mult <= 0:
            raise bad(f"{where}.speed_multiplier", f"{mult!r} must be finite and > 0")
        if not MIN_SPEED <= speed * mult <= MAX_SPEED:
            raise bad(f"{where}.speed_multiplier",
                      f"{mult:g} x speed {speed:g} = {speed * mult:g} is outside "
                      f"{MIN_SPEED}..{MAX_SPEED}")
        if entry is not None and mult != 1.0 and not caps.get("supports_speed", False):
            raise bad(f"{where}.speed_multiplier", f"model {name!r} has no speed control")
        instruction = m.instruction or ""
        if len(instruction) > MAX_TEXT_CHARS:
            raise bad(f"{where}.instruction", f"{len(instruction)} characters; at most "
                                              f"{MAX_TEXT_CHARS}")
        if instruction and entry is not None and not caps.get("expressiveness", False):
            raise bad(f"{where}.instruction", f"model {name!r} does not follow delivery "
                                              "instructions (expressiveness is false)")
        if (m.reference_clip_path or "") and entry is not None and not caps.get(
                "supports_reference_clip", False):
            raise bad(f"{where}.reference_clip_path",
                      f"model {name!r} does not support it (supports_reference_clip is false)")
        modes[mode_name] = DeliveryMode(mode_name, instruction, float(mult))
    default_mode = profile.default_delivery_mode or ""
    if default_mode == NEUTRAL:
        default_mode = ""
    if default_mode and default_mode not in modes:
        raise bad("default_delivery_mode",
                  f"{default_mode!r} is not one of delivery_modes "
                  f"({', '.join(modes) or 'none'})")
    return Voice(model=name, speaker_id=int(profile.speaker_id), speed=float(speed),
                 language=language, modes=modes, default_mode=default_mode,
                 emit_visemes=bool(profile.emit_visemes), profile=profile)
