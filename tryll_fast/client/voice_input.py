"""Voice inputs on the client: a handle per microphone (docs/voice.md, "Voice input").

    mic = client.create_voice_input(sample_rate=48000)          # the game's capture format
    mic.set_on_transcript(lambda kind, text: print(kind.name, text))
    mic.begin()                                                 # hands-free
    for chunk in capture():                                     # int16 PCM, ~20 ms each
        mic.feed(chunk)                                         # AudioBuffer, no reply
    text = mic.wait_final()                                     # the UtteranceFinal text
    npc.send(text)                                              # the game starts the turn

`begin`, `end` (push-to-talk release), `cancel` and `destroy` are requests (an Ack; 4103,
4104, 4102 otherwise), described once here in VoiceInputCalls and written out for the
blocking and the asyncio handle (voice_input_handle.py) by tools/gen_client.py.
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.client.core import Call


class VoiceInputCalls:
    """The voice input requests of one handle (an Ack each)."""

    def begin(self, auto_finish_on_silence: bool = True, max_utterance_ms: int = 60000) -> Call:
        """Open an utterance. Hands-free (auto_finish_on_silence) it ends by itself after
        the player's first phrase; push-to-talk, end() ends it. 4103 if one is open."""
        return Call("BeginUtteranceRequest", lambda rid: codec.BeginUtteranceRequest(
            request_id=rid, voice_input_id=self.id,
            auto_finish_on_silence=bool(auto_finish_on_silence),
            max_utterance_ms=int(max_utterance_ms)), lambda r: None)

    def end(self) -> Call:
        """Push-to-talk release: finish the utterance now (its UtteranceFinal follows)."""
        return Call("EndUtteranceRequest", lambda rid: codec.EndUtteranceRequest(
            request_id=rid, voice_input_id=self.id), lambda r: None)

    def cancel(self) -> Call:
        """Drop the utterance: no transcript comes for it."""
        return Call("CancelUtteranceRequest", lambda rid: codec.CancelUtteranceRequest(
            request_id=rid, voice_input_id=self.id), lambda r: None)

    def destroy(self) -> Call:
        """Release the handle (its model is unloaded when nothing else uses it)."""
        return Call("DestroyVoiceInputRequest", lambda rid: codec.DestroyVoiceInputRequest(
            request_id=rid, voice_input_id=self.id), lambda r: None)


def create_voice_input_call(model_name: str, sample_rate: int, channels: int,
                            vad_threshold: float, vad_min_silence_ms: int,
                            vad_speech_pad_ms: int, hotwords_storage_path: str,
                            hotwords_score: float) -> Call:
    return Call("CreateVoiceInputRequest", lambda rid: codec.CreateVoiceInputRequest(
        request_id=rid, model_name=model_name,
        input_format=codec.WireAudioFormat(sample_rate=sample_rate, channels=channels,
                                           bits_per_sample=16),
        vad_threshold=vad_threshold, vad_min_silence_ms=vad_min_silence_ms,
        vad_speech_pad_ms=vad_speech_pad_ms, hotwords_storage_path=hotwords_storage_path,
        hotwords_score=hotwords_score), lambda r: r.voice_input_id)
