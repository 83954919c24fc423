"""The wire layout of the original Tryll schema's public ancestor (about protocol 3), as
facts we wrote down (not the file), and the protocol's version history as edits to it.

`ANCESTOR_TABLES[name]` lists each field in declaration order as (name, type, default):
the type in our parser's spelling with canonical scalars (`ulong` for uint64), `[T]` for
vectors, `union U` for unions; the default for scalars and enums (None: an optional
scalar, `= null`; enums as member names). A union field takes two vtable slots, so the
slot of a field is computed, never written down.

`expected_v29()` applies `EDITS` in order and returns what schema/*.fbs must begin with,
table by table. Removal in this lineage is deletion (the later fields move up a slot);
a field the history replaces takes the slot of the first field it replaces. Edits that
the history does not dictate are our decisions, each listed in docs/protocol.md.
"""
from __future__ import annotations

import copy

S = "string"

ANCESTOR_ENUMS = {
    "Placement": ("ubyte", {"InPlaceOfUser": 0, "BeforeUserAsUser": 1, "BeforeUserAsSystem": 2,
                            "AfterUserAsUser": 3, "AfterUserAsSystem": 4}),
    "CannedResponseSelectionStrategy": ("ubyte", {"Random": 0, "First": 1, "RoundRobin": 2}),
    "TurnStatus": ("ubyte", {"Success": 0, "Error": 1, "Cancelled": 2}),
    "InferenceEngine": ("ubyte", {"Mock": 0, "LlamaCpp": 1, "OnnxGenAI": 2, "WindowsML": 3,
                                  "OpenVino": 4, "TensorRtLlm": 5, "SherpaOnnx": 6,
                                  "Supertonic": 7}),
    "StringStorageKind": ("ubyte", {"List": 0, "Map": 1, "Multimap": 2}),
    "TranscriptUpdateKind": ("ubyte", {"SpeechStart": 0, "Partial": 1, "SegmentFinal": 2,
                                       "UtteranceFinal": 3}),
    "ModelStatus": ("ubyte", {"Absent": 0, "Local": 1, "Downloading": 2, "Loaded": 3,
                              "Downloaded": 4}),
}

ANCESTOR_UNIONS = {
    "NodeParams": [
        "GenerateParams", "HumanMessageGuardrailParams", "CannedResponseParams",
        "ToolCallParams", "RetrieveParams", "InstructionParams", "ClassifyIntentParams",
        "ClassifyIntentLLMParams", "IntentToInstructionParams", "GenerateAndSpeakParams"],
    "MessageBody": [
        "SessionReady", "ConfigureSessionRequest", "ConfigureSessionResponse",
        "CreateAgentRequest", "CreateAgentResponse", "SendMessageRequest",
        "DestroyAgentRequest", "AnswerText", "TurnComplete", "ErrorResponse", "Ack",
        "ListModelsRequest", "ListModelsResponse", "DownloadModelRequest", "DownloadProgress",
        "DownloadComplete", "CreateStringStorageRequest", "CreateStringStorageResponse",
        "DestroyStringStorageRequest", "NodeEvent", "LoadModelRequest", "LoadModelResponse",
        "UnloadModelRequest", "CreateEmbeddedStringStorageRequest",
        "CreateEmbeddedStringStorageResponse", "DestroyEmbeddedStringStorageRequest",
        "ChangeAgentParamRequest", "CreateVoiceInputRequest", "CreateVoiceInputResponse",
        "BeginUtteranceRequest", "AudioBuffer", "EndUtteranceRequest",
        "CancelUtteranceRequest", "WireTranscriptUpdate", "DestroyVoiceInputRequest",
        "TtsAudioFormatFrame", "TtsAudioFrame"],
}

RID = ("request_id", "ulong", 0)
AID = ("agent_id", "ulong", 0)
VID = ("voice_input_id", "ulong", 0)

ANCESTOR_TABLES = {
    # nodes.fbs
    "ToolParamDefinition": [("name", S, None), ("type", S, None), ("description", S, None)],
    "ToolDefinition": [("name", S, None), ("description", S, None),
                       ("parameters", "[ToolParamDefinition]", None)],
    "SamplingOverrides": [("temperature", "float", None), ("top_p", "float", None),
                          ("top_k", "int", None), ("min_p", "float", None),
                          ("max_tokens", "int", None), ("seed", "int", None),
                          ("repeat_penalty", "float", None), ("presence_penalty", "float", None),
                          ("frequency_penalty", "float", None)],
    "GenerateParams": [("model_name", S, None), ("system_prompt", S, None), ("template", S, None),
                       ("placement", "Placement", "InPlaceOfUser"), ("stream", "bool", False),
                       ("sampling", "SamplingOverrides", None), ("default_exit", S, None)],
    "HumanMessageGuardrailParams": [("string_storage", S, None),
                                    ("inline_strings", "[string]", None),
                                    ("triggered_exit", S, None), ("not_triggered_exit", S, None)],
    "CannedResponseParams": [("string_storage", S, None), ("inline_strings", "[string]", None),
                             ("selection_strategy", "CannedResponseSelectionStrategy",
                              "RoundRobin"),
                             ("default_exit", S, None)],
    "ToolCallParams": [("model_name", S, None), ("system_prompt", S, None),
                       ("tool_call_format", S, None), ("tools", "[ToolDefinition]", None),
                       ("generate_on_no_tool", "bool", False), ("notify_client", "bool", False),
                       ("sampling", "SamplingOverrides", None), ("tool_called_exit", S, None),
                       ("no_tool_called_exit", S, None)],
    "RetrieveParams": [("embedded_string_storage", S, None), ("top_k", "int", 2),
                       ("threshold", "float", 0.0), ("source", S, None), ("filter", S, None),
                       ("found_exit", S, None), ("not_found_exit", S, None)],
    "InstructionParams": [("instruction_name", S, None), ("instruction", S, None),
                          ("default_exit", S, None)],
    "ClassifyIntentParams": [("embedded_string_storage", S, None), ("metadata_field", S, None),
                             ("threshold", "float", 0.0), ("filter", S, None),
                             ("notify_client", "bool", False), ("diagnostic_topk", "int", 1),
                             ("found_exit", S, None), ("not_found_exit", S, None)],
    "ClassifyIntentLLMParams": [("model_name", S, None), ("intents_ids", S, None),
                                ("intents_prompt", S, None), ("system_prompt", S, None),
                                ("history_turns", "int", 4), ("threshold", "float", 0.5),
                                ("margin", "float", 0.0), ("notify_client", "bool", False),
                                ("not_found_intent", S, None), ("found_exit", S, None),
                                ("not_found_exit", S, None)],
    "IntentToInstructionParams": [("string_storage", S, None), ("inline_keys", "[string]", None),
                                  ("inline_strings", "[string]", None),
                                  ("instruction_name", S, None), ("default_exit", S, None)],
    "GenerateAndSpeakParams": [("model_name", S, None), ("tts_model_name", S, None),
                               ("system_prompt", S, None), ("template", S, None),
                               ("placement", "Placement", "InPlaceOfUser"),
                               ("sampling", "SamplingOverrides", None),
                               ("speaker_id", "int", 0), ("speed", "float", 1.0),
                               ("min_sentence_chars", "int", 12), ("default_exit", S, None)],
    # messages.fbs
    "NodeParam": [("key", S, None), ("value", S, None)],
    "NodeDescription": [("name", S, None), ("params", "union NodeParams", None)],
    "GraphDescription": [("nodes", "[NodeDescription]", None), ("start_node", S, None)],
    "SessionReady": [("protocol_version", "uint", 0), ("session_id", "ulong", 0),
                     ("codegen_fingerprint", S, None)],
    "ConfigureSessionRequest": [RID, ("inference_engine", "InferenceEngine", "Mock"),
                                ("allow_auto_model_downloading", "bool", False),
                                ("game_name", S, None), ("stt_engine", "InferenceEngine", "Mock"),
                                ("tts_engine", "InferenceEngine", "Mock"),
                                ("embedding_engine", "InferenceEngine", "Mock"),
                                ("storage_data_folder", S, None)],
    "CreateAgentRequest": [RID, ("graph", "GraphDescription", None),
                           ("default_model_name", S, None), ("enable_diagnostics", "bool", False)],
    "SendMessageRequest": [RID, AID, ("text", S, None)],
    "DestroyAgentRequest": [RID, AID],
    "ChangeAgentParamRequest": [RID, AID, ("node_name", S, None),
                                ("params", "union NodeParams", None)],
    "CreateStringStorageRequest": [RID, ("name", S, None), ("kind", "StringStorageKind", "List"),
                                   ("strings", "[string]", None), ("keys", "[string]", None),
                                   ("file_path", S, None)],
    "DestroyStringStorageRequest": [RID, ("name", S, None)],
    "CreateEmbeddedStringStorageRequest": [RID, ("name", S, None), ("config_path", S, None),
                                           ("strings", "[string]", None),
                                           ("embedding_model", S, None)],
    "CreateEmbeddedStringStorageResponse": [RID, ("name", S, None), ("record_count", "uint", 0),
                                            ("embedding_dim", "uint", 0)],
    "DestroyEmbeddedStringStorageRequest": [RID, ("name", S, None)],
    "ConfigureSessionResponse": [RID],
    "CreateAgentResponse": [RID, AID],
    "AnswerText": [RID, AID, ("text", S, None), ("is_delta", "bool", False),
                   ("is_final", "bool", False)],
    "TurnComplete": [RID, AID, ("status", "TurnStatus", "Success"), ("debug_info", S, None),
                     ("tokens_generated", "uint", 0)],
    "ErrorResponse": [RID, ("code", "uint", 0), ("message", S, None), AID],
    "Ack": [RID, AID],
    "NodeEvent": [RID, AID, ("node_name", S, None), ("event_type", S, None),
                  ("kv_pairs", "[NodeParam]", None)],
    "CreateStringStorageResponse": [RID, ("name", S, None)],
    "ModelInfo": [("name", S, None), ("status", "ModelStatus", "Absent"),
                  ("huggingface_repo", S, None), ("size_bytes", "ulong", 0)],
    "ListModelsRequest": [RID],
    "ListModelsResponse": [RID, ("models", "[ModelInfo]", None)],
    "DownloadModelRequest": [RID, ("model_name", S, None)],
    "LoadModelRequest": [RID, ("model_name", S, None)],
    "LoadModelResponse": [RID],
    "UnloadModelRequest": [RID, ("model_name", S, None)],
    "DownloadProgress": [RID, ("model_name", S, None), ("bytes_downloaded", "ulong", 0),
                         ("total_bytes", "ulong", 0), ("percent", "float", 0.0)],
    "DownloadComplete": [RID, ("model_name", S, None), ("success", "bool", False),
                         ("error", S, None)],
    "WireAudioFormat": [("sample_rate", "uint", 0), ("channels", "ushort", 0),
                        ("bits_per_sample", "ushort", 0)],
    "CreateVoiceInputRequest": [RID, ("model_name", S, None),
                                ("input_format", "WireAudioFormat", None),
                                ("vad_threshold", "float", 0.5),
                                ("vad_min_silence_ms", "uint", 500),
                                ("vad_speech_pad_ms", "uint", 250),
                                ("hotwords_storage_path", S, None),
                                ("hotwords_score", "float", 1.5)],
    "CreateVoiceInputResponse": [RID, VID],
    "BeginUtteranceRequest": [RID, VID, ("agent_id", "ulong", 0),
                              ("auto_finish_on_silence", "bool", True),
                              ("max_utterance_ms", "uint", 60000)],
    "AudioBuffer": [VID, ("pcm", "[ubyte]", None)],
    "EndUtteranceRequest": [RID, VID],
    "CancelUtteranceRequest": [RID, VID],
    "WireTranscriptUpdate": [VID, ("text", S, None),
                             ("kind", "TranscriptUpdateKind", "SpeechStart"),
                             ("audio_ms_consumed", "uint", 0)],
    "DestroyVoiceInputRequest": [RID, VID],
    "TtsAudioFormatFrame": [RID, AID, ("format", "WireAudioFormat", None)],
    "TtsAudioFrame": [RID, AID, ("pcm", "[ubyte]", None)],
    "Message": [("body", "union MessageBody", None)],
}


def _f(name, type_, default=None, deprecated=False):
    return {"name": name, "type": type_, "default": default, "deprecated": deprecated}


# (version, what, table, arguments, why). "v" = the protocol's version history says it;
# "ours" = the evidence was silent and we chose (docs/protocol.md says why).
EDITS = [
    # v4: the connection hello and the session split
    ("v4", "rename", "SessionReady", "ConnectionReady", "v4: ConnectionReady is the hello"),
    ("v4", "delete", "ConnectionReady", "session_id", "v4: no session_id in the hello"),
    ("v4", "rename", "ConfigureSessionRequest", "CreateSessionRequest",
     "v4: ConfigureSession renamed CreateSession"),
    ("v4", "rename", "ConfigureSessionResponse", "CreateSessionResponse", "v4"),
    ("v4", "append", "CreateSessionResponse", [_f("session_id", "ulong", 0)],
     "v4: CreateSessionResponse returns the server-allocated session_id"),
    # between v3 and v5: the seed fixes CreateAgentRequest.workload at field id 7
    ("ours", "append", "CreateAgentRequest", [_f("maintain_dialogue_history", "bool", True)],
     "before v5's trailing variables, so that v11's workload lands on id 7 as the seed says"),
    ("v5", "append", "CreateAgentRequest", [_f("variables", "[AgentVariable]")],
     "v5: the trailing CreateAgentRequest.variables"),
    ("v6", "append", "CreateAgentRequest",
     [_f("kv_cache_initialization", "KvCacheInitialization", "AllocateOnly")],
     "v6: agent KV-cache lifecycle initialization"),
    ("v9", "replace", "ToolCallParams", ("notify_client", _f("disposition", "ToolCallDisposition",
                                                            "Acknowledge")),
     "v9: one disposition replaced notify_client, pause_after_tool_call, history_policy"),
    ("v10", "insert_before", "RetrieveParams",
     ("source", [_f("retrieval_mode", "RetrievalMode", "Vector"), _f("rrf_k", "int", 60)]),
     "v10: retrieval_mode and rrf_k inserted before source"),
    ("v11", "append", "CreateAgentRequest", [_f("workload", "AgentWorkload", "Interactive")],
     "v11: CreateAgentRequest.workload (field id 7)"),
    ("v12", "append", "CreateSessionRequest", [_f("locale", S)], "v12: the session locale"),
    ("v12", "append", "ModelInfo", [_f("languages", "[string]")], "v12: ModelInfo.languages"),
    ("v12", "append", "ToolCallParams", [_f("pause_timeout_ms", "int", 0)],
     "v12: pause deadlines"),
    ("v13", "replace", "CreateSessionRequest", ("inference_engine", _f("model_config",
                                                                      "ModelConfig")),
     "v13: model_config replaced the four per-role engine fields"),
    ("v13", "delete", "CreateSessionRequest", "stt_engine", "v13"),
    ("v13", "delete", "CreateSessionRequest", "tts_engine", "v13"),
    ("v13", "delete", "CreateSessionRequest", "embedding_engine", "v13"),
    ("v15", "append", "ModelInfo", [_f("dependencies", "[string]"),
                                    _f("tts_capabilities", "TtsCapabilitiesInfo")],
     "v15: ModelInfo.dependencies / tts_capabilities"),
    ("v16", "retype", "ClassifyIntentParams", ("notify_client", "NotifyClient", "Never"),
     "v16: notify_client a NotifyClient enum (Never = 0 = false)"),
    ("v16", "retype", "ClassifyIntentLLMParams", ("notify_client", "NotifyClient", "Never"),
     "v16"),
    ("v18", "default", "CreateVoiceInputRequest", ("vad_min_silence_ms", 1000),
     "v18: the omitted vad_min_silence_ms default became 1000"),
    # v19 reordered ClassifyIntentLLMParams; no public source gives the new order, so the
    # ancestor's order stays (docs/protocol.md)
    ("v23", "delete", "BeginUtteranceRequest", "agent_id", "v23: BeginUtteranceRequest.agent_id"),
    ("v24", "delete", "CreateSessionRequest", "storage_data_folder",
     "v24: storage_data_folder removed"),
    ("v24", "append", "ConnectionReady", [_f("mode", S)], "v24: ConnectionReady.mode"),
    ("v25", "append", "GenerateAndSpeakParams", [_f("first_chunk_max_chars", "int", 0)],
     "v25: first_chunk_max_chars"),
    ("v27", "delete", "GenerateAndSpeakParams", "tts_model_name", "v27: the voice moved"),
    ("v27", "delete", "GenerateAndSpeakParams", "speaker_id", "v27"),
    ("v27", "delete", "GenerateAndSpeakParams", "speed", "v27"),
    ("v27", "append", "CreateAgentRequest", [_f("voice", "VoiceProfile")],
     "v27: CreateAgentRequest.voice"),
    ("v27", "append", "Ack", [_f("warning", S)], "v27: SetAgentVoice's Ack.warning"),
    ("v28", "append", "GenerateParams", [_f("adaptation", "ModelAdaptation")], "v28"),
    ("v28", "append", "ToolCallParams", [_f("adaptation", "ModelAdaptation")], "v28"),
    ("v28", "append", "ClassifyIntentLLMParams", [_f("adaptation", "ModelAdaptation")], "v28"),
    ("v28", "append", "GenerateAndSpeakParams", [_f("adaptation", "ModelAdaptation")], "v28"),
    ("v29", "append", "CannedResponseParams", [_f("lines", "[LocalizableText]")], "v29"),
    ("v29", "deprecate", "CannedResponseParams", "inline_strings",
     "v29: the old slot stays, new peers do not write it"),
    ("v29", "append", "IntentToInstructionParams", [_f("instructions", "[LocalizableText]")],
     "v29"),
    ("v29", "deprecate", "IntentToInstructionParams", "inline_strings", "v29"),
    # superseded without the history saying how: the slot stays, unused; the successor the
    # seeds name is appended with our own fields
    ("ours", "deprecate", "GenerateParams", "stream", "superseded by send"),
    ("ours", "deprecate", "ToolCallParams", "tool_call_format",
     "the ToolCall reference: deprecated and ignored"),
    ("ours", "deprecate", "ToolCallParams", "generate_on_no_tool", "superseded by mode"),
    ("ours", "deprecate", "CreateSessionRequest", "allow_auto_model_downloading",
     "CreateAgent never downloads (seed)"),
    # defaults the original's 0.3.0 reference pages give (newer than the ancestor)
    ("ours", "default", "RetrieveParams", ("threshold", 0.5), "0.3.0 reference: 0.5"),
    ("ours", "default", "ClassifyIntentParams", ("threshold", 0.25), "0.3.0 reference: 0.25"),
    ("ours", "default", "ClassifyIntentParams", ("diagnostic_topk", 5), "0.3.0 reference: 5"),
    ("ours", "default", "ClassifyIntentLLMParams", ("history_turns", 2), "0.3.0 reference: 2"),
    ("ours", "default", "ClassifyIntentLLMParams", ("margin", 0.15), "0.3.0 reference: 0.15"),
    ("ours", "default", "GenerateParams", ("placement", "BeforeUserAsSystem"),
     "0.3.0 reference: BeforeUserAsSystem"),
    ("ours", "default", "GenerateAndSpeakParams", ("placement", "BeforeUserAsSystem"),
     "0.3.0 reference: BeforeUserAsSystem"),
]

# Tables the ancestor lacks but the original's 0.3.0 reference pages list in declaration
# order (its generated Unreal structs), before the version history edits them.
REFERENCE_030_TABLES = {
    "SpeakParams": [("tts_model_name", S, None), ("speaker_id", "int", 0),
                    ("speed", "float", 1.0), ("min_sentence_chars", "int", 12),
                    ("default_exit", S, None)],
}
REFERENCE_030_EDITS = [
    ("v25", "append", "SpeakParams", [_f("first_chunk_max_chars", "int", 0)], "v25"),
    ("v27", "delete", "SpeakParams", "tts_model_name", "v27: the voice moved"),
    ("v27", "delete", "SpeakParams", "speaker_id", "v27"),
    ("v27", "delete", "SpeakParams", "speed", "v27"),
]

# Members appended to the ancestor's enums and unions (values only ever grow).
ENUM_APPENDS = {
    "TurnStatus": {"PauseTimedOut": 3},                 # seed: TurnStatus numbering
    "ModelStatus": {"Incomplete": 5},                   # v15
    "Placement": {"SystemPromptEnd": 5},                # ours
    "CannedResponseSelectionStrategy": {"ShuffleNoRepeat": 3},   # ours
    "InferenceEngine": {"FasterWhisper": 8, "OnnxRuntime": 9},   # ours
}
UNION_RENAMES = {"MessageBody": {"SessionReady": "ConnectionReady",
                                 "ConfigureSessionRequest": "CreateSessionRequest",
                                 "ConfigureSessionResponse": "CreateSessionResponse"}}


def _field_list(rows):
    return [_f(n, t, d) for n, t, d in rows]


def expected_v29() -> dict[str, list[dict]]:
    """{table: the fields (name, type, default, deprecated) it must start with in v29}."""
    tables = {name: _field_list(rows) for name, rows in ANCESTOR_TABLES.items()}
    tables.update({name: _field_list(rows) for name, rows in REFERENCE_030_TABLES.items()})
    for _version, what, table, arg, _why in EDITS + REFERENCE_030_EDITS:
        fields = tables[table]
        names = [f["name"] for f in fields]
        if what == "rename":
            tables[arg] = tables.pop(table)
        elif what == "delete":
            del fields[names.index(arg)]
        elif what == "append":
            fields.extend(copy.deepcopy(arg))
        elif what == "replace":
            old, new = arg
            fields[names.index(old)] = copy.deepcopy(new)
        elif what == "insert_before":
            before, new = arg
            i = names.index(before)
            fields[i:i] = copy.deepcopy(new)
        elif what == "retype":
            name, type_, default = arg
            f = fields[names.index(name)]
            f["type"], f["default"] = type_, default
        elif what == "default":
            name, default = arg
            fields[names.index(name)]["default"] = default
        elif what == "deprecate":
            fields[names.index(arg)]["deprecated"] = True
        else:
            raise AssertionError(what)
    return tables


def ancestor_fields(table: str) -> list[dict]:
    return _field_list(ANCESTOR_TABLES[table])


def slots(fields: list[dict]) -> list[int]:
    """The vtable slot of each field (a union takes its type slot and its value slot)."""
    out, slot = [], 0
    for f in fields:
        if f["type"].startswith("union "):
            out.append(slot + 1)
            slot += 2
        else:
            out.append(slot)
            slot += 1
    return out
