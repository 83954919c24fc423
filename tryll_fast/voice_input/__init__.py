"""Voice input: the player's microphone, turned into transcripts (docs/voice.md).

Owns: the compiled audio path (_audio.pyx: AudioBuffer int16 at any rate -> 16 kHz float
in a ring buffer), the voice input handle and its utterance state machine (handle.py), and
the listener thread that runs the VAD and commits segments (listener.py). It uses the
engine roles (a SpeechToText engine and its VAD) and sends WireTranscriptUpdate frames
through a callback; it knows nothing of sockets, sessions or agents. The server never
starts a turn from a transcript: the client does, from the UtteranceFinal text.
"""
