"""Voice inputs (docs/voice.md, "Voice input"): CreateVoiceInput, BeginUtterance,
AudioBuffer, EndUtterance, CancelUtterance, DestroyVoiceInput.

CreateVoiceInput runs on the session's lane (it loads the speech-to-text model and its
VAD, and reads the hotwords file); the others answer on the reactor thread. AudioBuffer
never gets a reply: a buffer for a handle that does not exist (or is not listening) is
dropped and counted in the server's `audio_buffers_dropped`. Handles are numbered
server-wide; a session only sees its own (4102 otherwise).
"""
from __future__ import annotations

import logging
import math

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, ModelError, TryllError
from tryll_fast.knowledge import paths as storage
from tryll_fast.server.dispatch import handles
from tryll_fast.server.handlers.agents import load_refused
from tryll_fast.server.logs import fields
from tryll_fast.voice_input._audio import MAX_CHANNELS, MAX_RATE, MIN_RATE
from tryll_fast.voice_input.handle import VadSettings, VoiceInput

log = logging.getLogger("tryll_fast.server.voice_input")

MAX_HOTWORD_CHARS = 600         # Whisper's prompt holds about 224 tokens


def handle_of(session, vid: int) -> VoiceInput:
    handle = session.voice_inputs.get(vid)
    if handle is None:
        raise TryllError(ErrorCode.VoiceInputNotFound,
                         f"voice_input_id {vid} names no voice input of this session")
    return handle


def _format(req) -> tuple[int, int]:
    fmt = req.input_format
    if fmt is None:
        return 16000, 1
    rate = fmt.sample_rate or 16000
    channels = fmt.channels or 1
    bits = fmt.bits_per_sample or 16
    if bits != 16:
        raise TryllError(ErrorCode.AudioFormatUnsupported,
                         f"input_format.bits_per_sample {bits}: AudioBuffer carries signed "
                         "16-bit little-endian PCM only")
    if not MIN_RATE <= rate <= MAX_RATE:
        raise TryllError(ErrorCode.AudioFormatUnsupported,
                         f"input_format.sample_rate {rate} Hz is outside "
                         f"{MIN_RATE}..{MAX_RATE}")
    if not 1 <= channels <= MAX_CHANNELS:
        raise TryllError(ErrorCode.AudioFormatUnsupported,
                         f"input_format.channels {channels} is outside 1..{MAX_CHANNELS}")
    return rate, channels


def _vad(req) -> VadSettings:
    t = req.vad_threshold
    if not (math.isfinite(t) and 0.0 < t < 1.0):
        raise TryllError(ErrorCode.InvalidParamValue,
                         f"vad_threshold {t!r} must be between 0 and 1 (exclusive)")
    silence = req.vad_min_silence_ms or 1000        # omitted / 0: the v18 default
    if not 100 <= silence <= 10_000:
        raise TryllError(ErrorCode.InvalidParamValue,
                         f"vad_min_silence_ms {silence} is outside 100..10000")
    pad = req.vad_speech_pad_ms
    if pad > 2000:
        raise TryllError(ErrorCode.InvalidParamValue,
                         f"vad_speech_pad_ms {pad} is above 2000")
    return VadSettings(threshold=float(t), min_silence_ms=int(silence), speech_pad_ms=int(pad))


def load_hotwords(root, path: str) -> list[str]:
    """The phrases of a hotwords .txt under the storage root (one a line; blank lines and
    `#` comments skipped)."""
    file = storage.resolve(root, path, suffixes=(".txt",),
                           what="hotwords_storage_path")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TryllError(ErrorCode.StorageFileNotFound,
                         f"hotwords_storage_path: {path!r} cannot be read as UTF-8 text: "
                         f"{exc}") from None
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def hotword_prompt(phrases: list[str], score: float) -> str | None:
    """What the decoder is given (stt.py: a score <= 1 means off)."""
    if score <= 1.0 or not phrases:
        return None
    out, used = [], 0
    for p in phrases:
        if used + len(p) + 2 > MAX_HOTWORD_CHARS:
            break
        out.append(p)
        used += len(p) + 2
    return ", ".join(out)


@handles("CreateVoiceInputRequest")
def create_voice_input(session, req):
    rate, channels = _format(req)
    vad = _vad(req)
    score = req.hotwords_score
    if not math.isfinite(score) or score < 0:
        raise TryllError(ErrorCode.InvalidHotwordsScore,
                         f"hotwords_score {score!r} must be a finite number >= 0")
    session.run_blocking(req.request_id, "CreateVoiceInputRequest",
                         lambda: _create(session, req, rate, channels, vad))


def _create(session, req, rate: int, channels: int, vad: VadSettings):
    server = session.server
    cap = server.config.session_max_voice_inputs
    if len(session.voice_inputs) >= cap:
        raise TryllError(ErrorCode.SessionLimitReached,
                         f"the session holds {len(session.voice_inputs)} voice inputs, the "
                         f"most session.max_voice_inputs allows ({cap}); destroy one first")
    hotwords = None
    if req.hotwords_storage_path:
        hotwords = hotword_prompt(load_hotwords(server.config.storage_root,
                                                req.hotwords_storage_path),
                                  float(req.hotwords_score))
    name = req.model_name
    entry = server.catalog.get(name) if name else None
    if entry is None or entry.role != "stt":
        stt = ", ".join(e.name for e in server.catalog.visible() if e.role == "stt") or "none"
        raise TryllError(ErrorCode.SttModelLoadFailed,
                         f"model_name {name!r} is not a speech-to-text model of the catalog "
                         f"(speech-to-text models: {stt})")
    try:
        lease = server.models.lease(name)
    except ModelError as exc:
        raise load_refused(exc, ErrorCode.SttModelLoadFailed,
                           f"model_name {name!r} cannot be loaded") from None
    engine = lease.obj
    if getattr(engine, "vad", None) is None:
        lease.release()
        raise TryllError(ErrorCode.SttModelLoadFailed,
                         f"model_name {name!r} has no voice activity detector (its catalog "
                         "entry must depend on a vad model)")
    try:
        handle = VoiceInput(server.new_voice_input_id(), send=session.send_reply,
                            engine=engine, lease=lease, sample_rate=rate, channels=channels,
                            vad=vad, hotwords=hotwords, notify=server.listener.notify,
                            locale=lambda: session.locale)
    except Exception as exc:
        lease.release()
        raise TryllError(ErrorCode.SttModelLoadFailed,
                         f"model_name {name!r}: the voice input could not start: {exc}"
                         ) from exc
    if not server.register_voice_input(session, handle):
        _release(handle)
        return None
    log.info("voice input created", extra=fields(session=session.id, voice_input=handle.id,
                                                 model=name, rate=rate, channels=channels,
                                                 hotwords=hotwords is not None))
    return codec.CreateVoiceInputResponse(request_id=req.request_id,
                                          voice_input_id=handle.id)


def _release(handle: VoiceInput) -> None:
    handle.destroy()
    handle.lease.release()


@handles("BeginUtteranceRequest")
def begin_utterance(session, req):
    handle = handle_of(session, req.voice_input_id)
    handle.begin(req.request_id, req.auto_finish_on_silence, req.max_utterance_ms)
    return codec.Ack(request_id=req.request_id)


@handles("AudioBuffer", before_session="drop", during_shutdown=True, silent=True)
def audio_buffer(session, msg):
    handle = session.voice_inputs.get(msg.voice_input_id)
    if handle is None:
        session.server.audio_buffers_dropped += 1
        return None
    pcm = msg.pcm
    if pcm is not None and len(pcm):
        handle.feed(pcm)
    else:
        handle.counters.buffers += 1            # an empty buffer: nothing to hear
    return None


@handles("EndUtteranceRequest")
def end_utterance(session, req):
    handle_of(session, req.voice_input_id).end()
    return codec.Ack(request_id=req.request_id)


@handles("CancelUtteranceRequest", during_shutdown=True)
def cancel_utterance(session, req):
    handle_of(session, req.voice_input_id).cancel()
    return codec.Ack(request_id=req.request_id)


@handles("DestroyVoiceInputRequest", during_shutdown=True)
def destroy_voice_input(session, req):
    handle = handle_of(session, req.voice_input_id)
    session.server.destroy_voice_input(session, handle)
    return codec.Ack(request_id=req.request_id)
