"""The message mix a game session really sends, built both ways.

For each message: `ours_value()` (a codec value), `ref_build(b)` (the same
message written with the official Builder API, or the object API for the two
complex ones), and a reader per side that touches every field the way a
server or a game client would."""
import array
import flatbuffers
import numpy as np

from benchmarks.reference import load
from tryll_fast import codec as c

# the flatc module, its generated functions called directly (T.AnswerTextStart(b), ...),
# as a user's code calls them after `from messages_generated import *`
T = load()


PCM = array.array("h", (int(1000 * ((i % 64) - 32)) for i in range(2048)))   # 4 KiB
PCM_BYTES = PCM.tobytes()      # TtsAudioFrame.pcm is [ubyte]: int16 LE as bytes
PCM_NP = np.frombuffer(PCM_BYTES, dtype=np.uint8)


# -- graph for CreateAgentRequest: 5 nodes, a ToolCall with 3 tools --------
def _tool(name, desc, params):
    return c.ToolDefinition(name=name, description=desc, parameters=[
        c.ToolParamDefinition(name=p, type="string", description=f"The {p}.")
        for p in params])


def create_agent_value():
    nodes = [
        c.NodeDescription(name="guard", params=c.HumanMessageGuardrailParams(
            inline_strings=["(?i)kill", "(?i)password"], triggered_exit="refuse",
            not_triggered_exit="tools")),
        c.NodeDescription(name="tools", params=c.ToolCallParams(
            system_prompt="You can open doors, give items and check the weather.",
            tools=[_tool("open_door", "Open a door in the tavern.", ["door"]),
                   _tool("give_item", "Give the player an item.", ["item", "count"]),
                   _tool("get_weather", "Current weather for a city.", ["city"])],
            disposition=c.ToolCallDisposition.NotifyAndAcknowledge,
            tool_called_exit="answer", no_tool_called_exit="answer")),
        c.NodeDescription(name="lore", params=c.InstructionParams(
            instruction_name="lore", instruction="Brenna runs the Prancing Pony since 1402.",
            default_exit="answer")),
        c.NodeDescription(name="answer", params=c.GenerateParams(
            model_name="SmolLM2-135M-Instruct",
            system_prompt="You are Brenna, a cheerful innkeeper. Answer in two sentences.",
            sampling=c.SamplingOverrides(temperature=0.7, top_p=0.9, max_tokens=128))),
        c.NodeDescription(name="refuse", params=c.CannedResponseParams(
            lines=[c.LocalizableText(text="I won't talk about that."),
                   c.LocalizableText(text="Let's change the subject.")])),
    ]
    return c.CreateAgentRequest(
        request_id=12, graph=c.GraphDescription(nodes=nodes, start_node="guard"),
        default_model_name="SmolLM2-135M-Instruct", enable_diagnostics=False,
        variables=[c.AgentVariable(name="gold", value=c.VarInt(value=12)),
                   c.AgentVariable(name="mood", value=c.VarString(value="happy"))],
        workload=c.AgentWorkload.Interactive)


def list_models_value():
    roles = [c.ModelRole.Language, c.ModelRole.Tts, c.ModelRole.Stt, c.ModelRole.Vad,
             c.ModelRole.Embedding]
    return c.ListModelsResponse(request_id=5, models=[
        c.ModelInfo(name=f"model-{i}", model_type=roles[i % 5],
                    engine=c.InferenceEngine.LlamaCpp,
                    status=c.ModelStatus.Downloaded, size_bytes=93_000_000 + i,
                    description=f"Catalog entry number {i}", context_size=8192,
                    languages=["en", "de"], dependencies=[] if i % 3 else ["silero-vad"],
                    tts_capabilities=c.TtsCapabilitiesInfo(sample_rate=22050, num_speakers=1)
                    if i % 5 == 1 else None)
        for i in range(10)])


# -- the mix ------------------------------------------------------------------
def _s(b, s):
    return b.CreateString(s)


def _finish(b, tag, body):
    T.MessageStart(b)
    T.MessageAddBodyType(b, tag)
    T.MessageAddBody(b, body)
    b.FinishSizePrefixed(T.MessageEnd(b))
    return bytes(b.Output())


def ref_send_message():
    b = flatbuffers.Builder(256)
    t = _s(b, "Good evening! Any rooms free tonight?")
    T.SendMessageRequestStart(b)
    T.SendMessageRequestAddRequestId(b, 41)
    T.SendMessageRequestAddAgentId(b, 3)
    T.SendMessageRequestAddText(b, t)
    return _finish(b, T.MessageBody.SendMessageRequest, T.SendMessageRequestEnd(b))


def ref_answer_text():
    b = flatbuffers.Builder(128)
    t = _s(b, " tavern")
    n = _s(b, "answer")
    T.AnswerTextStart(b)
    T.AnswerTextAddRequestId(b, 41)
    T.AnswerTextAddAgentId(b, 3)
    T.AnswerTextAddText(b, t)
    T.AnswerTextAddIsDelta(b, True)
    T.AnswerTextAddNodeName(b, n)
    return _finish(b, T.MessageBody.AnswerText, T.AnswerTextEnd(b))


def ref_turn_complete():
    b = flatbuffers.Builder(128)
    T.TurnCompleteStart(b)
    T.TurnCompleteAddRequestId(b, 41)
    T.TurnCompleteAddAgentId(b, 3)
    T.TurnCompleteAddStatus(b, 0)
    T.TurnCompleteAddTokensGenerated(b, 64)
    return _finish(b, T.MessageBody.TurnComplete, T.TurnCompleteEnd(b))


def ref_tts_audio():
    b = flatbuffers.Builder(5000)
    p = b.CreateNumpyVector(PCM_NP)
    n = _s(b, "speak")
    T.TtsAudioFrameStart(b)
    T.TtsAudioFrameAddRequestId(b, 41)
    T.TtsAudioFrameAddAgentId(b, 3)
    T.TtsAudioFrameAddPcm(b, p)
    T.TtsAudioFrameAddNodeName(b, n)
    T.TtsAudioFrameAddSampleOffset(b, 44100)
    T.TtsAudioFrameAddSentenceIndex(b, 2)
    return _finish(b, T.MessageBody.TtsAudioFrame, T.TtsAudioFrameEnd(b))


def ref_transcript():
    b = flatbuffers.Builder(128)
    t = _s(b, "is the blacksmith still open")
    T.WireTranscriptUpdateStart(b)
    T.WireTranscriptUpdateAddVoiceInputId(b, 1)
    T.WireTranscriptUpdateAddText(b, t)
    T.WireTranscriptUpdateAddKind(b, 1)
    T.WireTranscriptUpdateAddSegmentIndex(b, 0)
    T.WireTranscriptUpdateAddStartMs(b, 120)
    T.WireTranscriptUpdateAddEndMs(b, 1880)
    return _finish(b, T.MessageBody.WireTranscriptUpdate, T.WireTranscriptUpdateEnd(b))


def _ref_object_api(value):
    """Complex messages: the official object API (XT ... Pack), as a user would."""
    obj = T.MessageT.InitFromPackedBuf(c.encode(value), 4)

    def build():
        b = flatbuffers.Builder(1024)
        b.FinishSizePrefixed(obj.Pack(b))
        return bytes(b.Output())
    return build


# readers: touch every field, as the receiving side would ---------------------
def ours_read_send_message(frame):
    o = c.decode_frame(frame).body
    return [o.request_id, o.agent_id, o.text]


def ours_read_answer_text(frame):
    o = c.decode_frame(frame).body
    return [o.request_id, o.agent_id, o.text, o.is_delta, o.is_final, o.node_name]


def ours_read_turn_complete(frame):
    o = c.decode_frame(frame).body
    return [o.request_id, o.agent_id, o.status, o.debug_info, o.tokens_generated]


def ours_read_tts_audio(frame):
    o = c.decode_frame(frame).body
    return [o.request_id, o.agent_id, o.pcm, o.node_name, o.sample_offset, o.sentence_index]


def ours_read_transcript(frame):
    o = c.decode_frame(frame).body
    return [o.voice_input_id, o.text, o.kind, o.segment_index, o.start_ms, o.end_ms]


def ours_read_list_models(frame):
    body = c.decode_frame(frame).body
    out = [body.request_id]
    for m in body.models:
        caps = m.tts_capabilities
        out.append((m.name, m.model_type, m.engine, m.status, m.size_bytes, m.description,
                    m.context_size, m.languages, m.dependencies,
                    None if caps is None else (caps.sample_rate, caps.supports_speed,
                                               caps.supports_voice_description,
                                               caps.supports_reference_clip,
                                               caps.expressiveness, caps.num_speakers)))
    return out


def ours_read_all(frame):
    return c.decode_frame(frame).body.to_dict()


def _ref_body(frame, name):
    m = T.Message.GetRootAs(frame, 4)
    m.BodyType()
    tab = m.Body()
    obj = getattr(T, name)()
    obj.Init(tab.Bytes, tab.Pos)
    return obj


def _str(x):
    return None if x is None else x.decode("utf-8")


def ref_read_send_message(frame):
    o = _ref_body(frame, "SendMessageRequest")
    return [o.RequestId(), o.AgentId(), _str(o.Text())]


def ref_read_answer_text(frame):
    o = _ref_body(frame, "AnswerText")
    return [o.RequestId(), o.AgentId(), _str(o.Text()), o.IsDelta(), o.IsFinal(),
            _str(o.NodeName())]


def ref_read_turn_complete(frame):
    o = _ref_body(frame, "TurnComplete")
    return [o.RequestId(), o.AgentId(), o.Status(), _str(o.DebugInfo()), o.TokensGenerated()]


def ref_read_tts_audio(frame):
    o = _ref_body(frame, "TtsAudioFrame")
    return [o.RequestId(), o.AgentId(), o.PcmAsNumpy(), _str(o.NodeName()), o.SampleOffset(),
            o.SentenceIndex()]


def ref_read_transcript(frame):
    o = _ref_body(frame, "WireTranscriptUpdate")
    return [o.VoiceInputId(), _str(o.Text()), o.Kind(), o.SegmentIndex(), o.StartMs(),
            o.EndMs()]


def ref_read_list_models(frame):
    o = _ref_body(frame, "ListModelsResponse")
    out = [o.RequestId()]
    for i in range(o.ModelsLength()):
        m = o.Models(i)
        caps = m.TtsCapabilities()
        out.append((_str(m.Name()), m.ModelType(), m.Engine(), m.Status(), m.SizeBytes(),
                    _str(m.Description()), m.ContextSize(),
                    [_str(m.Languages(j)) for j in range(m.LanguagesLength())],
                    [_str(m.Dependencies(j)) for j in range(m.DependenciesLength())],
                    None if caps is None else (caps.SampleRate(), caps.SupportsSpeed(),
                                               caps.SupportsVoiceDescription(),
                                               caps.SupportsReferenceClip(),
                                               caps.Expressiveness(), caps.NumSpeakers())))
    return out


def ref_read_all(frame):
    """Every field of a complex message: the object API's full unpack."""
    return T.MessageT.InitFromPackedBuf(frame, 4)


MIX = {
    # name: (ours value factory, ref encoder, ours reader, ref reader)
    "SendMessageRequest": (
        lambda: c.SendMessageRequest(request_id=41, agent_id=3,
                                     text="Good evening! Any rooms free tonight?"),
        ref_send_message, ours_read_send_message, ref_read_send_message),
    "AnswerText": (
        lambda: c.AnswerText(request_id=41, agent_id=3, node_name="answer", text=" tavern",
                             is_delta=True),
        ref_answer_text, ours_read_answer_text, ref_read_answer_text),
    "TurnComplete": (
        lambda: c.TurnComplete(request_id=41, agent_id=3, status=c.TurnStatus.Success,
                               tokens_generated=64),
        ref_turn_complete, ours_read_turn_complete, ref_read_turn_complete),
    "TtsAudioFrame": (
        lambda: c.TtsAudioFrame(request_id=41, agent_id=3, node_name="speak", pcm=PCM_BYTES,
                                sample_offset=44100, sentence_index=2),
        ref_tts_audio, ours_read_tts_audio, ref_read_tts_audio),
    "CreateAgentRequest": (
        create_agent_value, None, ours_read_all, ref_read_all),
    "ListModelsResponse": (
        list_models_value, None, ours_read_list_models, ref_read_list_models),
    "WireTranscriptUpdate": (
        lambda: c.WireTranscriptUpdate(voice_input_id=1, kind=c.TranscriptUpdateKind.Partial,
                                       text="is the blacksmith still open", start_ms=120,
                                       end_ms=1880),
        ref_transcript, ours_read_transcript, ref_read_transcript),
}


def ref_encoder(name):
    value_fn, ref_enc, _, _ = MIX[name]
    return ref_enc if ref_enc is not None else _ref_object_api(value_fn())
