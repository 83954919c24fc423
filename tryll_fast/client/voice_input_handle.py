"""The voice input handles of the blocking and the asyncio client (their requests come
from client.voice_input.VoiceInputCalls, written out in _methods.py)."""
from __future__ import annotations

import asyncio
import queue
import time
from typing import Any, Callable

from tryll_fast import codec
from tryll_fast.client._methods import AsyncVoiceInputMethods, VoiceInputMethods
from tryll_fast.client.errors import TryllError
from tryll_fast.errors import ErrorCode

Kind = codec.TranscriptUpdateKind


class VoiceInputBase:
    """What both handles share: feeding audio and receiving transcripts."""

    def __init__(self, client, voice_input_id: int) -> None:
        self.client = client
        self.id = voice_input_id
        self._on_transcript: Callable[[Any, str], None] | None = None
        self._on_update: Callable[[Any], None] | None = None
        client._voice_inputs[voice_input_id] = self._update

    def feed(self, pcm) -> None:
        """One AudioBuffer: signed 16-bit little-endian PCM in the handle's format (bytes,
        a numpy int16 array, array('h')). No reply, ever; about 20 ms of audio a call is
        what the protocol expects."""
        self.client.send_frame(codec.encode(codec.AudioBuffer(voice_input_id=self.id,
                                                              pcm=pcm)))

    def feed_paced(self, pcm: bytes, sample_rate: int, channels: int = 1) -> None:
        """Feed recorded PCM as a microphone would: 20 ms AudioBuffers at real-time pace
        (blocks for the audio's duration). For a .wav standing in for a player."""
        step = sample_rate // 50 * 2 * channels
        t0 = time.monotonic()
        for k, i in enumerate(range(0, len(pcm), step)):
            self.feed(pcm[i:i + step])
            delay = t0 + (k + 1) * 0.02 - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def set_on_transcript(self, callback: Callable[[Any, str], None] | None) -> None:
        """callback(kind, text) per WireTranscriptUpdate: kind is a
        codec.TranscriptUpdateKind (SpeechStart, Partial, SegmentFinal, UtteranceFinal).
        Runs on the reader thread (the event loop for the asyncio client)."""
        self._on_transcript = callback

    def set_on_update(self, callback: Callable[[Any], None] | None) -> None:
        """callback(update): the whole WireTranscriptUpdate (segment index, times)."""
        self._on_update = callback

    def _update(self, body) -> None:
        if self._on_update is not None:
            self._on_update(body)
        if self._on_transcript is not None:
            self._on_transcript(Kind(body.kind), body.text)
        self._deliver(body)

    def _deliver(self, body) -> None:
        raise NotImplementedError


class VoiceInputHandle(VoiceInputMethods, VoiceInputBase):
    """A voice input of a TryllClient (requests block for their Ack)."""

    def __init__(self, client, voice_input_id: int) -> None:
        super().__init__(client, voice_input_id)
        self._finals: queue.SimpleQueue = queue.SimpleQueue()

    def _deliver(self, body) -> None:
        if body.kind == Kind.UtteranceFinal:
            self._finals.put(body.text)

    def wait_final(self, timeout: float | None = None) -> str:
        """The text of the next UtteranceFinal (blocks; not on the reader thread)."""
        self.client._check_thread("VoiceInputHandle.wait_final")
        limit = self.client.timeout if timeout is None else timeout
        try:
            return self._finals.get(timeout=limit)
        except queue.Empty:
            raise TryllError(ErrorCode.Timeout, f"voice input {self.id}: no UtteranceFinal "
                                                f"within {limit} s") from None


class AsyncVoiceInputHandle(AsyncVoiceInputMethods, VoiceInputBase):
    """A voice input of an AsyncTryllClient (requests are awaited)."""

    def __init__(self, client, voice_input_id: int) -> None:
        super().__init__(client, voice_input_id)
        self._finals: asyncio.Queue = asyncio.Queue()

    def _deliver(self, body) -> None:
        if body.kind == Kind.UtteranceFinal:
            self._finals.put_nowait(body.text)

    async def wait_final(self, timeout: float | None = None) -> str:
        limit = self.client.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(self._finals.get(), limit)
        except asyncio.TimeoutError:
            raise TryllError(ErrorCode.Timeout, f"voice input {self.id}: no UtteranceFinal "
                                                f"within {limit} s") from None
