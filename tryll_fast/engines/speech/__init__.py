"""Speech engines: the voices that speak for agents (and, next, the ears that listen).

Owns: eSpeak NG phonemization (espeak.py), the Piper VITS voice run with onnxruntime
(piper.py) and its fetch-time graph preparation (prepare.py), the phoneme -> viseme table
(visemes.py) and the compiled timeline kernel (_timeline.pyx), and the synthesis thread
that serves every agent's sentences earliest-deadline-first (engine.py). It hands back
float samples and viseme cues; turning them into frames is the workflow's and the
codec's job (workflow/speech.py, codec.encode_tts_audio). It knows nothing of sessions,
sockets or graphs.
"""
