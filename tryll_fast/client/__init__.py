"""The Python client: blocking (`TryllClient`, a reader thread) and asyncio
(`AsyncTryllClient`), with the same methods.

Owns: the client side of the wire protocol: connecting and checking ConnectionReady's
version (5004), request ids and futures, matching replies and errors to requests,
delivering unsolicited frames to callbacks, `TryllError(code, message)`; agents
(`create_agent` -> `Agent` / `AsyncAgent`): the graph builder, variables, per-agent turn
streams serialised client-side, cancel, change_params, update/get variables, tool-call
and pause callbacks with resume, the dialog lifecycle (append / remove interactions,
export / import, save / load, KV-cache prefill / evict / status), their voice (audio and
viseme callbacks, set_voice, set_delivery_mode), destroy; voice inputs
(`create_voice_input` -> a handle: begin / feed / end / cancel / destroy, transcripts);
mutable knowledge bases (`ensure_mutable_kb` -> a handle: write / query / get / list /
stats / export / delete / clear) and game-memory files (`save_game_memory`,
`load_game_memory`).
It shares the codec with the server and nothing else.
"""
from tryll_fast.client.agents import (
    AddToSet, Agent, Assign, AsyncAgent, AsyncTurnStream, GraphDescription, RemoveFromSet,
    Reset, ToolResult, TurnResult, TurnStream,
)
from tryll_fast.client.dialog import DialogImport, KvCacheStatus, SavedDialog
from tryll_fast.client.aio import AsyncTryllClient
from tryll_fast.client.errors import ReaderThreadError, TryllError
from tryll_fast.client.memory import KbHit, KbRecord, WriteOutcome
from tryll_fast.client.memory_handle import AsyncMutableKb, MutableKb
from tryll_fast.client.sync import TryllClient
from tryll_fast.client.voice_input_handle import AsyncVoiceInputHandle, VoiceInputHandle
from tryll_fast.errors import ErrorCode

__all__ = ["AddToSet", "Agent", "Assign", "AsyncAgent", "AsyncTryllClient", "AsyncTurnStream",
           "DialogImport", "ErrorCode", "GraphDescription", "KvCacheStatus",
           "ReaderThreadError", "RemoveFromSet", "Reset", "SavedDialog", "ToolResult",
           "TryllClient", "TryllError", "TurnResult", "TurnStream", "VoiceInputHandle",
           "AsyncVoiceInputHandle", "AsyncMutableKb", "KbHit", "KbRecord", "MutableKb",
           "WriteOutcome"]
