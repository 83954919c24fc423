"""Seed frames and a deterministic mutator for fuzzing the wire codec.

Shared by the atheris harness (fuzz/fuzz_codec.py) and the bounded fuzz tests
(tests/test_hostile.py). Every seed is a valid `Message` *payload* (the bytes
after the 4-byte length prefix) built with `codec.encode`, chosen to be field
rich: strings (ASCII and multi-byte UTF-8), vectors of scalars, structs,
strings and tables, every union (MessageBody, NodeParams, VariableValue,
PersistedComponentBody) and the nested TDLG dialog snapshot.

    python -m fuzz.corpus --write-corpus fuzz/corpus_dir   # one file per seed
"""
from __future__ import annotations

import argparse
import functools
import os
import random
import struct
import sys

from tryll_fast import codec

__all__ = ["named_seeds", "seeds", "seed_frames", "snapshot_bytes", "mutate",
           "read_everything", "write_corpus"]


# ---------------------------------------------------------------------------
# Seed bodies

def _sampling():
    return codec.SamplingOverrides(
        temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1,
        presence_penalty=0.2, frequency_penalty=0.3, seed=12345, max_tokens=256,
        stop=["</s>", "User:", "\n\n"])


def _context():
    return codec.ContextOverrides(kv_cache_type=codec.KvCacheType.Q8_0, n_gpu_layers=33,
                                  n_batch=512, n_ubatch=128,
                                  flash_attention=codec.FlashAttention.Enabled, n_threads=4)


def _adaptation():
    return codec.ModelAdaptation(loras=[codec.LoraAdapter(path="loras/pirate.gguf", scale=0.8),
                                        codec.LoraAdapter(path="loras/ödön.gguf", scale=0.25)])


def _tools():
    return [
        codec.ToolDefinition(
            name="open_door", description="Opens a door the player points at.",
            parameters=[
                codec.ToolParamDefinition(name="door_id", type="integer",
                                          description="Which door", required=True),
                codec.ToolParamDefinition(name="force", type="boolean",
                                          description="Kick it open", required=False),
            ]),
        codec.ToolDefinition(
            name="give_item", description="Hands an item to the player.",
            parameters=[
                codec.ToolParamDefinition(name="item", type="string",
                                          description="Item name",
                                          enum_values=["sword", "shield", "potion"]),
                codec.ToolParamDefinition(name="count", type="integer"),
            ]),
        codec.ToolDefinition(name="wave", description="Waves at the player. 👋"),
    ]


def _graph():
    nodes = [
        codec.NodeDescription(name="guard", params=codec.HumanMessageGuardrailParams(
            inline_strings=["(?i)kill", "bomb"], triggered_exit="refuse",
            not_triggered_exit="tools")),
        codec.NodeDescription(name="tools", params=codec.ToolCallParams(
            input="", model_name="qwen3-4b", context_size=4096,
            system_prompt="You control an NPC. Call tools when useful.",
            tools=_tools(), mode=codec.ToolCallMode.CallOrAnswer, parallel_tool_calls=True,
            disposition=codec.ToolCallDisposition.AwaitResult, acknowledge_text="done",
            pause_timeout_ms=30000, sampling=_sampling(), context=_context(),
            tool_called_exit="speak", no_tool_called_exit="answer",
            adaptation=_adaptation())),
        codec.NodeDescription(name="answer", params=codec.GenerateParams(
            model_name="qwen3-4b", context_size=8192, system_prompt="You are Bjørn, a guard.",
            template="{{#knowledge_lore}}{{text}}{{/knowledge_lore}}",
            placement=codec.Placement.BeforeUserAsSystem, send=codec.SendMode.Streamed,
            sampling=_sampling(), context=_context(), default_exit="speak")),
        codec.NodeDescription(name="refuse", params=codec.CannedResponseParams(
            selection_strategy=codec.CannedResponseSelectionStrategy.Random,
            lines=[codec.LocalizableText(text="No.", key="refuse_1", string_table="npc"),
                   codec.LocalizableText(text="Niemals!", key="refuse_2")])),
        codec.NodeDescription(name="speak", params=codec.SpeakParams(
            min_sentence_chars=10, first_chunk_max_chars=40)),
    ]
    return codec.GraphDescription(nodes=nodes, start_node="guard")


def _voice():
    return codec.VoiceProfile(
        model_name="kokoro-82m", speaker_id=3, speaker_name="af_heart", speed=1.25,
        language="en-GB", description="A gruff old guard", reference_clip_path="clips/g.wav",
        reference_clip_text="Halt! Who goes there?",
        delivery_modes=[
            codec.DeliveryMode(name="whisper", instruction="Speak in a hushed whisper.",
                               speed_multiplier=0.8),
            codec.DeliveryMode(name="angry", instruction="Shout.", speed_multiplier=1.3,
                               reference_clip_path="clips/angry.wav",
                               reference_clip_text="Get out!"),
        ],
        default_delivery_mode="whisper", emit_visemes=True)


def _variables():
    return [
        codec.AgentVariable(name="hp", value=codec.VarInt(value=-42)),
        codec.AgentVariable(name="mood", value=codec.VarFloat(value=0.125)),
        codec.AgentVariable(name="name", value=codec.VarString(value="Grünwald")),
        codec.AgentVariable(name="hostile", value=codec.VarBool(value=True)),
        codec.AgentVariable(name="items", value=codec.VarStringSet(values=["key", "map", "€"])),
    ]


def _snapshot():
    comps = [
        codec.PersistedComponent(
            slot_name="user_message", slot_kind=codec.PersistedSlotKind.User,
            history_role=codec.PersistedHistoryRole.User, created_at_ms=1700000000000,
            body=codec.PersistedUserMessage(text="Where is the castle?")),
        codec.PersistedComponent(
            node_name="lore", slot_name="knowledge", producer=codec.PersistedProducer.Node,
            body=codec.PersistedKnowledge(source="lore", query="castle", entries=[
                codec.PersistedKnowledgeEntry(id="r1", text="North of the river.",
                                              metadata_json='{"k": 1}', distance=0.12),
                codec.PersistedKnowledgeEntry(id="r2", text="Ruined.", distance=0.4)])),
        codec.PersistedComponent(
            node_name="tools", slot_name="tool_call", producer=codec.PersistedProducer.Node,
            body=codec.PersistedToolCall(call_id="c00000001", tool_name="open_door",
                                         arguments_json='{"door_id": 3}',
                                         disposition="await_result", model_call_id="m1",
                                         state=codec.PersistedToolCallState.Resolved)),
        codec.PersistedComponent(
            slot_name="tool_result", history_role=codec.PersistedHistoryRole.Tool,
            producer=codec.PersistedProducer.ClientToolResult,
            body=codec.PersistedToolResult(call_id="c00000001", tool_name="open_door",
                                           result="opened")),
        codec.PersistedComponent(
            node_name="instr", slot_name="instruction",
            body=codec.PersistedInstruction(name="tone", text="Be terse.")),
        codec.PersistedComponent(
            node_name="answer", slot_name="assistant_message",
            history_role=codec.PersistedHistoryRole.Assistant,
            producer=codec.PersistedProducer.Node,
            body=codec.PersistedAssistantMessage(text="North, past the river.",
                                                 reasoning_content="<think>easy</think>",
                                                 truncated=True)),
        codec.PersistedComponent(
            node_name="sum", slot_name="summary",
            body=codec.PersistedSummary(text="They talked about castles.",
                                        summarized_interaction_count=7)),
    ]
    return codec.PersistedDialogSnapshot(
        format_version=1, graph_fingerprint="ab" * 32,
        node_names=["guard", "tools", "answer", "refuse", "speak"], locale="de-AT",
        exported_at_ms=1700000001234,
        interactions=[
            codec.PersistedInteraction(interaction_id=1, started_at_ms=1, completed_at_ms=2,
                                       components=comps[:3]),
            codec.PersistedInteraction(interaction_id=2, started_at_ms=3, completed_at_ms=4,
                                       outcome=codec.PersistedInteractionOutcome.CancelledKept,
                                       components=comps[3:]),
        ])


@functools.lru_cache(maxsize=None)
def snapshot_bytes() -> bytes:
    """A standalone TDLG buffer (file identifier written by encode_root)."""
    return codec.encode_root(_snapshot())


def _bodies():
    pcm = struct.pack("<257h", *(int(20000 * ((i * 37) % 200 - 100) / 100)
                                 for i in range(257)))
    return [
        ("AnswerText_delta", codec.AnswerText(request_id=11, agent_id=7, node_name="answer",
                                              text="Hallo, Wanderer! ☀️ ", is_delta=True)),
        ("AnswerText_final", codec.AnswerText(request_id=2**64 - 1, agent_id=2**64 - 1,
                                              node_name="speak",
                                              text="Done.", is_delta=False, is_final=True)),
        ("SendMessageRequest", codec.SendMessageRequest(request_id=11, agent_id=7,
                                                        text="Open the gate, 門を開けて")),
        ("TurnComplete", codec.TurnComplete(request_id=11, agent_id=7,
                                            status=codec.TurnStatus.PauseTimedOut,
                                            debug_info='{"nodes": [1, 2]}',
                                            tokens_generated=321)),
        ("TtsAudioFormatFrame", codec.TtsAudioFormatFrame(
            request_id=11, agent_id=7, node_name="speak", format=codec.WireAudioFormat(
                sample_rate=22050, channels=1, bits_per_sample=16))),
        ("TtsAudioFrame", codec.TtsAudioFrame(request_id=11, agent_id=7, node_name="speak",
                                              pcm=pcm, sample_offset=48000, sentence_index=2)),
        ("TtsVisemeFrame", codec.TtsVisemeFrame(
            request_id=11, agent_id=7, node_name="speak", sentence_index=2,
            visemes=[codec.VisemeCue(sample_offset=i * 800, viseme=codec.Viseme(i % 15))
                     for i in range(9)])),
        ("CreateAgentRequest", codec.CreateAgentRequest(
            request_id=3, graph=_graph(), default_model_name="qwen3-4b",
            enable_diagnostics=True, maintain_dialogue_history=False, variables=_variables(),
            kv_cache_initialization=codec.KvCacheInitialization.Prefill,
            workload=codec.AgentWorkload.Background, voice=_voice())),
        ("ListModelsResponse", codec.ListModelsResponse(request_id=4, models=[
            codec.ModelInfo(name="qwen3-4b", model_type=codec.ModelRole.Language,
                            status=codec.ModelStatus(1), size_bytes=2_500_000_000,
                            huggingface_repo="Qwen/Qwen3-4B",
                            description="Small chat model", context_size=32768,
                            languages=["en", "de", "zh"]),
            codec.ModelInfo(name="whisper-small", model_type=codec.ModelRole.Stt,
                            engine=codec.InferenceEngine.SherpaOnnx, languages=["en"],
                            dependencies=["silero-vad"]),
            codec.ModelInfo(name="kokoro-82m", model_type=codec.ModelRole.Tts,
                            engine=codec.InferenceEngine.SherpaOnnx, size_bytes=330_000_000,
                            tts_capabilities=codec.TtsCapabilitiesInfo(
                                sample_rate=24000, supports_speed=True,
                                supports_voice_description=False,
                                supports_reference_clip=True, expressiveness=True,
                                num_speakers=54)),
        ])),
        ("WireTranscriptUpdate", codec.WireTranscriptUpdate(
            voice_input_id=5, kind=codec.TranscriptUpdateKind.SegmentFinal,
            text="open the gate please", audio_ms_consumed=1900, segment_index=1,
            start_ms=120, end_ms=1880)),
        ("ExportDialogResponse", codec.ExportDialogResponse(request_id=8, agent_id=7,
                                                            snapshot=snapshot_bytes())),
        ("ImportDialogRequest", codec.ImportDialogRequest(
            request_id=9, agent_id=7, snapshot=snapshot_bytes(),
            compatibility=codec.DialogCompatibility.AllowGraphMismatch)),
        ("UpdateAgentVariablesRequest", codec.UpdateAgentVariablesRequest(
            request_id=12, agent_id=7, updates=[
                codec.VariableUpdate(name="hp", op=codec.VariableOp.Assign,
                                     value=codec.VarInt(value=100)),
                codec.VariableUpdate(name="items", op=codec.VariableOp.AddToSet,
                                     value=codec.VarStringSet(values=["torch"])),
                codec.VariableUpdate(name="mood", op=codec.VariableOp.Reset),
                codec.VariableUpdate(name="name", value=codec.VarString(value="Ἀχιλλεύς")),
                codec.VariableUpdate(name="hostile", value=codec.VarBool(value=False)),
            ])),
        ("NodeEvent", codec.NodeEvent(request_id=11, agent_id=7, node_name="tools",
                                      event_type="tool_call",
                                      kv_pairs=[codec.NodeParam(key="tool_name", value="open_door"),
                                                codec.NodeParam(key="arguments_json",
                                                               value='{"door_id": 3}'),
                                                codec.NodeParam(key="call_id", value="c00000001"),
                                                codec.NodeParam(key="disposition",
                                                               value="await_result")])),
        ("ErrorResponse", codec.ErrorResponse(request_id=13, code=3003,
                                              message="node 'x' is not defined", agent_id=7)),
        ("Ack", codec.Ack(request_id=2**64 - 2, agent_id=7, warning="delivery mode dropped")),
        ("ConnectionReady", codec.ConnectionReady(protocol_version=29,
                                                  codegen_fingerprint="0123456789abcdef",
                                                  mode="dev")),
        ("CreateSessionRequest", codec.CreateSessionRequest(
            request_id=1, locale="pt-BR", game_name="Bjørn's Saga",
            model_config=codec.ModelConfig(
                engines=[codec.EngineHint(role=codec.ModelRole.Tts,
                                          engine=codec.InferenceEngine.SherpaOnnx),
                         codec.EngineHint()],
                placement_hints=[codec.PlacementHint(model_name="qwen3-4b",
                                                     placement=codec.MemoryPlacement.Vram)]))),
        ("ChangeAgentParamRequest", codec.ChangeAgentParamRequest(
            request_id=14, agent_id=7, node_name="answer",
            params=codec.GenerateParams(system_prompt="Be kind.", sampling=_sampling(),
                                        adaptation=_adaptation()))),
        ("AudioBuffer", codec.AudioBuffer(voice_input_id=5,
                                          pcm=struct.pack("<5h", 0, 1, -1, 32767, -32768) * 20)),
        ("CreateVoiceInputRequest", codec.CreateVoiceInputRequest(
            request_id=19, model_name="whisper-small", input_format=codec.WireAudioFormat(
                sample_rate=48000, channels=2, bits_per_sample=16), vad_threshold=0.6,
            vad_min_silence_ms=700, vad_speech_pad_ms=100,
            hotwords_storage_path="hotwords/names.txt", hotwords_score=2.0)),
        ("DownloadProgress", codec.DownloadProgress(
            request_id=20, model_name="qwen3-4b", bytes_downloaded=1 << 20,
            total_bytes=1 << 30, percent=0.09765625, current_file="qwen3-4b/model.gguf")),
        ("ResumeAgentRequest", codec.ResumeAgentRequest(
            request_id=15, agent_id=7, resume_node="speak",
            tool_results=[codec.ToolResult(call_id="c00000001", result='{"ok": true}'),
                          codec.ToolResult(call_id="c00000002", result="")])),
        ("GetMemoryConsumptionResponse", codec.GetMemoryConsumptionResponse(
            request_id=16, captured_at_ms=1700000000000,
            tiers=[codec.MemoryTierUsage(tier=codec.MemoryTier(1), used_bytes=1 << 30,
                                         total_bytes=8 << 30, budget_bytes=6 << 30)],
            entries=[codec.MemoryConsumptionEntry(size_bytes=123456, owner_name="qwen3-4b",
                                                  model_name="qwen3-4b", session_id=1,
                                                  agent_id=7, node_name="answer",
                                                  shared=True)])),
        ("EnsureMutableKbRequest", codec.EnsureMutableKbRequest(
            request_id=17, store_name="npc_memory", schema=codec.MutableKbSchema(
                schema_name="npc_memory", schema_version=2,
                embedding_model_name="bge-small", metadata_fields=["npc", "day"]))),
        ("CreateStringStorageRequest", codec.CreateStringStorageRequest(
            request_id=18, name="greetings", kind=codec.StringStorageKind(1),
            strings=["Hi", "Hello", "Grüß Gott"], keys=["a", "b", "c"])),
    ]


def _filled(cls, rid: int):
    """An instance of a message table with each scalar and string field set away from its
    default (an int to a small value, a float to 0.5, a bool to True, a string to
    multi-byte UTF-8): a seed for a message type the hand-written bodies above leave out.
    Enums, tables, vectors and unions keep their defaults."""
    import enum
    default = cls()
    kwargs = {}
    for field in cls.FIELDS:
        v = getattr(default, field)
        if isinstance(v, bool):
            kwargs[field] = True
        elif isinstance(v, enum.Enum):
            continue
        elif isinstance(v, int):
            kwargs[field] = rid if field == "request_id" else 7
        elif isinstance(v, float):
            kwargs[field] = 0.5
        elif isinstance(v, str) or v is None and field.endswith(("name", "text", "id_str")):
            kwargs[field] = f"{field} ☀ Grüße"
    try:
        codec.encode(cls(**kwargs))
        return cls(**kwargs)
    except (TypeError, ValueError, OverflowError):
        return default


def _every_type(covered: set) -> list:
    """One seed for each MessageBody member no hand-written body covers."""
    out = []
    for member in codec.MessageBody:
        if member.value and member.name not in covered:
            out.append((f"{member.name}_filled", _filled(getattr(codec, member.name),
                                                         1000 + member.value)))
    return out


@functools.lru_cache(maxsize=None)
def _named_seeds() -> tuple:
    out = []
    bodies = _bodies()
    bodies += _every_type({type(body).__name__ for _, body in bodies})
    for name, body in bodies:
        frame = codec.encode(body)
        out.append((name, frame[4:]))
    return tuple(out)


def named_seeds() -> list[tuple[str, bytes]]:
    """[(name, payload)] for every seed (payload = frame without length prefix)."""
    return list(_named_seeds())


def seeds() -> list[bytes]:
    """The seed payloads (valid `Message` buffers, no length prefix)."""
    return [p for _, p in _named_seeds()]


def seed_frames() -> list[bytes]:
    """The seeds as complete wire frames (length prefix + payload)."""
    return [struct.pack("<I", len(p)) + p for p in seeds()]


# ---------------------------------------------------------------------------
# Deterministic mutator

# 32-bit values that make good offsets / lengths / soffsets when written over a field
_INTERESTING32 = (0, 1, 2, 3, 4, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000,
                  0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFC, 0xFFFFFFF8,
                  0xFFFFFF00)
_INTERESTING16 = (0, 1, 2, 3, 4, 5, 6, 8, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0xFFFE)


def _pick32(data_len: int, pos: int, rng: random.Random) -> int:
    r = rng.random()
    if r < 0.35:
        return rng.choice(_INTERESTING32)
    if r < 0.55:   # an offset that lands near the end (or just past it)
        return (data_len - pos + rng.randint(-12, 12)) & 0xFFFFFFFF
    if r < 0.75:   # a small positive/negative displacement: retargets an offset
        return rng.randint(-64, 64) & 0xFFFFFFFF
    return rng.getrandbits(32)


def _one(data: bytearray, rng: random.Random) -> bytearray:
    n = len(data)
    op = rng.randrange(12)
    if n == 0:
        op = 8  # only extension makes sense
    if op == 0:                                   # flip one bit
        i = rng.randrange(n)
        data[i] ^= 1 << rng.randrange(8)
    elif op == 1:                                 # set a byte to a boundary value
        data[rng.randrange(n)] = rng.choice((0x00, 0xFF, 0x7F, 0x80))
    elif op == 2 and n >= 4:                      # 32-bit overwrite, 4-aligned (offsets)
        pos = rng.randrange(0, n - 3, 4) if n >= 4 else 0
        struct.pack_into("<I", data, pos, _pick32(n, pos, rng))
    elif op == 3 and n >= 2:                      # 16-bit overwrite, 2-aligned (vtables)
        pos = rng.randrange(0, n - 1, 2)
        v = rng.choice(_INTERESTING16) if rng.random() < 0.7 else rng.getrandbits(16)
        struct.pack_into("<H", data, pos, v)
    elif op == 4 and n >= 4:                      # add a small delta to an aligned u32
        pos = rng.randrange(0, n - 3, 4)
        (v,) = struct.unpack_from("<I", data, pos)
        struct.pack_into("<I", data, pos, (v + rng.randint(-16, 16)) & 0xFFFFFFFF)
    elif op == 5:                                 # truncate
        del data[rng.randrange(n):]
    elif op == 6:                                 # random byte anywhere
        data[rng.randrange(n)] = rng.getrandbits(8)
    elif op == 7:                                 # delete a slice
        a = rng.randrange(n)
        del data[a:a + rng.randint(1, 16)]
    elif op == 8:                                 # extend with junk
        k = rng.randint(1, 32)
        junk = bytes(rng.getrandbits(8) for _ in range(k)) if rng.random() < 0.5 \
            else bytes([rng.choice((0, 0xFF))]) * k
        data += junk
    elif op == 9:                                 # duplicate a slice in place
        a = rng.randrange(n)
        b = min(n, a + rng.randint(1, 32))
        at = rng.randrange(n + 1)
        data[at:at] = data[a:b]
    elif op == 10:                                # splice with another seed
        other = rng.choice(seeds())
        cut = rng.randrange(n + 1)
        ocut = rng.randrange(len(other) + 1)
        data[cut:] = other[ocut:]
    else:                                         # overwrite a 4-aligned u32 with an
        if n >= 8:                                # offset to another aligned position
            pos = rng.randrange(0, n - 3, 4)
            tgt = rng.randrange(0, n, 4)
            struct.pack_into("<I", data, pos, (tgt - pos) & 0xFFFFFFFF)
        else:
            data[rng.randrange(n)] ^= 0xFF
    return data


def mutate(data: bytes, rng: random.Random, max_ops: int = 4) -> bytes:
    """Apply 1..max_ops random mutations; the result depends only on (data, rng state)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, max_ops)):
        buf = _one(buf, rng)
    return bytes(buf)


# ---------------------------------------------------------------------------
# Reading a decoded view completely

def read_everything(obj, _depth: int = 0):
    """Touch every accessor of a decoded view (fields, union tags, vectors,
    struct members, zero-copy buffers, the nested TDLG snapshot) and return
    the `to_dict()` of the top object. Raises whatever the codec raises."""
    if isinstance(obj, codec.Message):
        obj.body_type
        body = obj.body
        if body is not None:
            read_everything(body, _depth + 1)
        return obj.to_dict()
    if isinstance(obj, codec.Table):
        for name in obj.FIELDS:
            v = getattr(obj, name)
            if name in obj.UNION_FIELDS:
                getattr(obj, name + "_type")
            _read_value(v, _depth)
        if isinstance(obj, (codec.ExportDialogResponse, codec.ImportDialogRequest)):
            snap = bytes(obj.snapshot)
            if snap:
                # verified as part of the frame; a TDLG identifier is not required there,
                # so decode_root may still reject it (MalformedMessage) - that is fine.
                try:
                    root = codec.decode_root(codec.PersistedDialogSnapshot, snap)
                except codec.MalformedMessage:
                    pass
                else:
                    read_everything(root, _depth + 1)
        return obj.to_dict()
    _read_value(obj, _depth)
    return obj


def _read_value(v, depth):
    if isinstance(v, codec.Table):
        read_everything(v, depth + 1)
    elif isinstance(v, codec.Struct):
        v.to_tuple()
    elif isinstance(v, memoryview):
        v.tolist()
        bytes(v)
    elif isinstance(v, (tuple, list)):
        for x in v:
            _read_value(x, depth)


# ---------------------------------------------------------------------------
# Corpus directory for atheris / libFuzzer

def write_corpus(directory: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, (name, payload) in enumerate(named_seeds()):
        path = os.path.join(directory, f"seed_{i:02d}_{name}.bin")
        with open(path, "wb") as f:
            f.write(payload)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-corpus", metavar="DIR", help="write one file per seed payload")
    ap.add_argument("--list", action="store_true", help="print the seeds and their sizes")
    args = ap.parse_args(argv)
    if args.write_corpus:
        paths = write_corpus(args.write_corpus)
        print(f"wrote {len(paths)} seeds to {args.write_corpus}")
    if args.list or not args.write_corpus:
        for name, payload in named_seeds():
            print(f"{len(payload):6d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
