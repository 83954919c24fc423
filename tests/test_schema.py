"""The schema itself: flatc accepts it cleanly, and the wire contract fixed by the
SPEC / the seeds / schema/CONVENTIONS.md holds, as seen by flatc, by our parser
(tools/fbs.py) and by the compiled codec."""
import importlib.util
import os
import re
import struct

import flatbuffers
import pytest

import reference
from reference import SCHEMA_DIR, Table, camel

SCHEMA = reference.load_schema()
FBS_FILES = ["messages.fbs", "nodes.fbs", "voice.fbs", "dialog.fbs"]
FLATC_MODES = {"python": ["--python", "--gen-object-api", "--gen-all"], "cpp": ["--cpp"]}

# SPEC §3, ordered by number: tag = position (NONE = 0).
MESSAGE_BODY = [
    "ConnectionReady", "CreateSessionRequest", "CreateSessionResponse", "CreateAgentRequest",
    "CreateAgentResponse", "SendMessageRequest", "DestroyAgentRequest", "AnswerText",
    "TurnComplete", "ErrorResponse", "Ack", "ListModelsRequest",
    "ListModelsResponse", "DownloadModelRequest", "DownloadProgress", "DownloadComplete",
    "CreateStringStorageRequest", "CreateStringStorageResponse", "DestroyStringStorageRequest",
    "NodeEvent", "LoadModelRequest", "LoadModelResponse", "UnloadModelRequest",
    "CreateEmbeddedStringStorageRequest", "CreateEmbeddedStringStorageResponse",
    "DestroyEmbeddedStringStorageRequest", "ChangeAgentParamRequest", "CreateVoiceInputRequest",
    "CreateVoiceInputResponse", "BeginUtteranceRequest", "AudioBuffer", "EndUtteranceRequest",
    "CancelUtteranceRequest", "WireTranscriptUpdate", "DestroyVoiceInputRequest",
    "TtsAudioFormatFrame", "TtsAudioFrame", "DeleteModelRequest", "DebugCommandRequest",
    "DebugCommandResponse", "CancelRequest", "ResumeAgentRequest", "UpdateAgentVariablesRequest",
    "GetAgentVariablesRequest", "GetAgentVariablesResponse", "PrefillAgentKvCacheRequest",
    "PrefillAgentKvCacheResponse", "EvictAgentKvCacheRequest", "EvictAgentKvCacheResponse",
    "GetAgentKvCacheStatusRequest", "GetAgentKvCacheStatusResponse", "AppendInteractionsRequest",
    "AppendInteractionsResponse", "RemoveInteractionsFromEndRequest",
    "RemoveInteractionsFromEndResponse", "SetInferenceThrottle", "SetSessionLocaleRequest",
    "ExportDialogRequest", "ExportDialogResponse", "ImportDialogRequest", "ImportDialogResponse",
    "GetMemoryConsumptionRequest", "GetMemoryConsumptionResponse", "EnsureMutableKbRequest",
    "EnsureMutableKbResponse", "EnumerateMutableKbsRequest", "EnumerateMutableKbsResponse",
    "MutableKbWriteRequest", "MutableKbWriteResponse", "MutableKbDeleteRequest",
    "MutableKbDeleteResponse", "MutableKbClearRequest", "MutableKbClearResponse",
    "MutableKbQueryRequest", "MutableKbQueryResponse", "MutableKbGetRequest",
    "MutableKbGetResponse", "MutableKbListRequest", "MutableKbListResponse",
    "MutableKbStatsRequest", "MutableKbStatsResponse", "ExportMutableKbRequest",
    "ExportMutableKbResponse", "ImportMutableKbRequest", "ImportMutableKbResponse",
    "SaveGameMemoryRequest", "SaveGameMemoryResponse", "LoadGameMemoryRequest",
    "LoadGameMemoryResponse", "SaveDialogRequest", "SaveDialogResponse", "LoadDialogRequest",
    "LoadDialogResponse", "TtsVisemeFrame", "SetAgentVoiceRequest", "SetAgentDeliveryModeRequest",
]

# SPEC §5: node -> the exits the SPEC fixes ("decide" rows have none listed here).
NODES = {
    "Generate": ["default"], "ToolCall": ["tool_called", "no_tool_called"],
    "Pause": ["default", "timeout"], "CannedResponse": ["default"], "Instruction": ["default"],
    "HumanMessageGuardrail": ["triggered", "not_triggered"], "Retrieve": ["found", "not_found"],
    "ClassifyIntent": ["found", "not_found"], "ClassifyIntentLLM": ["found", "not_found"],
    "ClassifyAttributesLLM": [], "IntentToInstruction": ["default"], "Summarize": [],
    "WriteToMemory": [], "Speak": ["default"], "GenerateAndSpeak": ["default"],
}

# Enum numbering fixed by the seeds (SPEC §3).
SEED_ENUMS = {
    "TurnStatus": {"Success": 0, "Error": 1, "Cancelled": 2, "PauseTimedOut": 3},
    "TranscriptUpdateKind": {"SpeechStart": 0, "Partial": 1, "SegmentFinal": 2,
                             "UtteranceFinal": 3},
    "KvCacheInitialization": {"AllocateOnly": 0, "Prefill": 1, "DeferAllocation": 2},
    "AgentWorkload": {"Interactive": 0, "Background": 1},
    "StringStorageKind": {"List": 0, "Map": 1, "Multimap": 2},
}

# docs/protocol.md "Wire layout": the only messages without request_id.
NO_REQUEST_ID = {"ConnectionReady", "AudioBuffer", "SetInferenceThrottle", "WireTranscriptUpdate"}
REQUEST_REPLY = [t.name for t in SCHEMA.of(Table) if t.name.endswith(("Request", "Response"))]


def fields(name):
    return [(f.name, str(f.type), f.default) for f in SCHEMA.decls[name].fields]


def official_members(ref, name):
    """{member: value} of a flatc-generated enum / union-tag class (without NONE)."""
    cls = getattr(ref.module(name), name)
    return {k: v for k, v in vars(cls).items() if not k.startswith("_") and k != "NONE"}


def official_vtable(buf):
    """(table position, {voffset: field offset}) of an official root buffer."""
    root = struct.unpack_from("<I", buf, 0)[0]
    vt = root - struct.unpack_from("<i", buf, root)[0]
    size = struct.unpack_from("<H", buf, vt)[0]
    slots = {vo: struct.unpack_from("<H", buf, vt + vo)[0] for vo in range(4, size, 2)}
    return root, {vo: off for vo, off in slots.items() if off}


# ---------------------------------------------------------------------------
# flatc

@pytest.mark.parametrize("mode", FLATC_MODES)
@pytest.mark.parametrize("fbs", FBS_FILES)
def test_flatc_compiles_without_warnings(tmp_path, fbs, mode):
    r = reference.run_flatc([*FLATC_MODES[mode], "-o", str(tmp_path),
                             os.path.join(SCHEMA_DIR, fbs)])
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert os.listdir(tmp_path), "flatc generated nothing"


# ---------------------------------------------------------------------------
# unions

def test_message_body_order(codec, ref):
    expected = [(name, tag) for tag, name in enumerate(MESSAGE_BODY, 1)]
    assert len(MESSAGE_BODY) == 96
    assert SCHEMA.decls["MessageBody"].members == expected
    assert official_members(ref, "MessageBody") == dict(expected)
    assert [(m.name, m.value) for m in codec.MessageBody if m.value] == expected


def test_node_params_members(codec, ref):
    expected = {f"{node}Params" for node in NODES}
    assert len(expected) == 15
    assert {m for m, _ in SCHEMA.decls["NodeParams"].members} == expected
    assert set(official_members(ref, "NodeParams")) == expected
    assert {m.name for m in codec.NodeParams if m.value} == expected


@pytest.mark.parametrize("node", [n for n in NODES if NODES[n]])
def test_node_exits(node):
    types = {n: t for n, t, _ in fields(f"{node}Params")}
    assert {f"{e}_exit": "string" for e in NODES[node]}.items() <= types.items()


# ---------------------------------------------------------------------------
# tables whose layout the seeds fix

def test_create_agent_workload_is_slot_7(codec, ref):
    f = next(f for f in SCHEMA.decls["CreateAgentRequest"].fields if f.name == "workload")
    assert (f.slot, f.voffset) == (7, 18)
    buf = ref.pack_root("CreateAgentRequest", {"workload": 1})
    root, slots = official_vtable(buf)
    assert list(slots) == [18], "flatc must place workload at vtable offset 18"
    assert buf[root + slots[18]] == 1
    assert codec.encode_root(codec.CreateAgentRequest(workload=1)) == buf
    view = codec.decode_root(codec.CreateAgentRequest, buf)
    assert view.workload is codec.AgentWorkload.Background


def test_set_inference_throttle(codec, ref):
    assert fields("SetInferenceThrottle") == [("throttle", "float", 0.0)]
    assert vars(ref.T("SetInferenceThrottle")()) == {"throttle": 0.0}
    assert codec.SetInferenceThrottle.FIELDS == ("throttle",)
    buf = ref.pack_root("SetInferenceThrottle", {"throttle": 0.5})
    root, slots = official_vtable(buf)
    assert struct.unpack_from("<f", buf, root + slots[4])[0] == 0.5


def test_resume_agent_request(codec, ref):
    assert [(n, t) for n, t, _ in fields("ResumeAgentRequest")] == [
        ("request_id", "ulong"), ("agent_id", "ulong"), ("resume_node", "string"),
        ("tool_results", "[ToolResult]")]
    assert [(n, t) for n, t, _ in fields("ToolResult")] == [
        ("call_id", "string"), ("result", "string")]
    assert list(vars(ref.T("ResumeAgentRequest")())) == [
        "requestId", "agentId", "resumeNode", "toolResults"]
    assert codec.ResumeAgentRequest.FIELDS == ("request_id", "agent_id", "resume_node",
                                               "tool_results")


@pytest.mark.parametrize("enum", SEED_ENUMS)
def test_seed_enum_numbering(codec, ref, enum):
    assert {m.name: m.value for m in getattr(codec, enum)} == SEED_ENUMS[enum]
    assert official_members(ref, enum) == SEED_ENUMS[enum]


# ---------------------------------------------------------------------------
# CONVENTIONS.md: request_id

@pytest.mark.parametrize("name", REQUEST_REPLY)
def test_request_id_is_field_0(codec, ref, name):
    assert fields(name)[0] == ("request_id", "ulong", 0)
    assert getattr(codec, name).FIELDS[0] == "request_id"
    buf = ref.pack_root(name, {"request_id": 0xA5A5A5A5_5A5A5A5A})
    root, slots = official_vtable(buf)
    assert list(slots) == [4], "flatc must place request_id in vtable slot 0"
    assert struct.unpack_from("<Q", buf, root + slots[4])[0] == 0xA5A5A5A5_5A5A5A5A
    assert vars(ref.T(name)())[camel("request_id")] == 0


def test_messages_without_request_id_are_the_listed_ones():
    lacking = {m for m in MESSAGE_BODY
               if not any(f.name == "request_id" for f in SCHEMA.decls[m].fields)}
    assert lacking == NO_REQUEST_ID


# ---------------------------------------------------------------------------
# dialog.fbs: TDLG

def test_dialog_file_identifier(codec, ref, tmp_path):
    with open(os.path.join(SCHEMA_DIR, "dialog.fbs"), encoding="utf-8") as f:
        assert re.search(r'^file_identifier\s+"TDLG"\s*;', f.read(), re.M)
    assert ("PersistedDialogSnapshot", "TDLG", "dialog.fbs") in SCHEMA.roots

    ours = codec.encode_root(codec.PersistedDialogSnapshot(format_version=1, locale="de"))
    assert ours[4:8] == b"TDLG"
    assert ours == ref.pack_root("PersistedDialogSnapshot", {"format_version": 1, "locale": "de"})

    # flatc compiling dialog.fbs alone must know the identifier too
    assert reference.run_flatc(["--python", "-o", str(tmp_path),
                                os.path.join(SCHEMA_DIR, "dialog.fbs")]).returncode == 0
    path = tmp_path / "Tryll" / "PersistedDialogSnapshot.py"
    spec = importlib.util.spec_from_file_location("dialog_alone", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.PersistedDialogSnapshot.PersistedDialogSnapshotBufferHasIdentifier(ours, 0)


def test_decode_root_requires_tdlg(codec, ref):
    b = flatbuffers.Builder(0)
    b.Finish(ref.to_object(ref.decl("PersistedDialogSnapshot"), {"format_version": 1}).Pack(b))
    with pytest.raises(codec.MalformedMessage):
        codec.decode_root(codec.PersistedDialogSnapshot, bytes(b.Output()))
