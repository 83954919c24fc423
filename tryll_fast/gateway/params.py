"""A pipeline connection's parameters (the WebSocket URL's query, the Socket.IO handshake's
query): agent, inputFormat, outputFormat, protocolVersion, and ours: commitMode,
audioSampleRate, bargeIn (docs/pipeline.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tryll_fast.gateway.config import PipelineAgent, PipelineConfig
from tryll_fast.gateway.elements import FORMATS, PROTOCOL_VERSIONS, TEXT, ElementError

# When a turn starts: auto = #commit or a final transcript; manual = #commit only (push to
# talk: final transcripts accumulate); token = every text token is a message of its own.
COMMIT_MODES = ("auto", "manual", "token")
BARGE_IN = ("true", "false")
# Raw audio's rate: what CreateVoiceInput accepts (the server resamples to 16 kHz).
MIN_AUDIO_RATE, MAX_AUDIO_RATE, DEFAULT_AUDIO_RATE = 8000, 192_000, 16_000


@dataclass(frozen=True)
class ConnectionParams:
    agent: PipelineAgent
    input_format: str = TEXT
    output_format: str = TEXT
    protocol_version: int = 1
    commit_mode: str = "auto"
    audio_sample_rate: int = DEFAULT_AUDIO_RATE   # raw audio: mono int16 LE at this rate
    barge_in: bool = True                         # the player's voice interrupts the agent


def parse_connection_params(query: Mapping[str, Any], config: PipelineConfig
                            ) -> ConnectionParams:
    """The parameters, or ElementError("InvalidConnectionParameter") naming the bad one.
    Other query keys (Socket.IO's EIO, transport, t) are ignored."""
    name = query.get("agent") or ""
    agent = config.agents.get(name) if name else config.default_agent
    if agent is None:
        raise _bad(f"agent={name!r} names no pipeline agent (agents: "
                   f"{', '.join(config.agents)})")
    return ConnectionParams(
        agent=agent, input_format=_format(query, "inputFormat"),
        output_format=_format(query, "outputFormat"),
        protocol_version=_version(query), commit_mode=_choice(query, "commitMode", COMMIT_MODES),
        audio_sample_rate=_rate(query), barge_in=_choice(query, "bargeIn", BARGE_IN) == "true")


def error_format(query: Mapping[str, Any]) -> tuple[str, int]:
    """The output format and protocol version to report a parameter error in: what the
    client asked for when that much is valid, else TEXT and version 1."""
    try:
        fmt = _format(query, "outputFormat")
    except ElementError:
        fmt = TEXT
    try:
        version = _version(query)
    except ElementError:
        version = 1
    return fmt, version


def _format(query: Mapping[str, Any], key: str) -> str:
    raw = query.get(key)
    if raw is None or raw == "":
        return TEXT
    value = str(raw).upper()
    if value not in FORMATS:
        raise _bad(f"{key}={raw!r} is not a format (one of {', '.join(FORMATS)})")
    return value


def _version(query: Mapping[str, Any]) -> int:
    raw = query.get("protocolVersion")
    if raw is None or raw == "":
        return 1
    try:
        version = int(raw)
    except ValueError:
        version = 0
    if version not in PROTOCOL_VERSIONS:
        raise _bad(f"protocolVersion={raw!r} is not a supported version (one of "
                   f"{', '.join(map(str, PROTOCOL_VERSIONS))})")
    return version


def _rate(query: Mapping[str, Any]) -> int:
    raw = query.get("audioSampleRate")
    if raw is None or raw == "":
        return DEFAULT_AUDIO_RATE
    try:
        rate = int(raw)
    except ValueError:
        rate = 0
    if not MIN_AUDIO_RATE <= rate <= MAX_AUDIO_RATE:
        raise _bad(f"audioSampleRate={raw!r} is not a sample rate in {MIN_AUDIO_RATE}.."
                   f"{MAX_AUDIO_RATE} Hz")
    return rate


def _choice(query: Mapping[str, Any], key: str, choices: tuple[str, ...]) -> str:
    raw = query.get(key)
    if raw is None or raw == "":
        return choices[0]
    if raw not in choices:
        raise _bad(f"{key}={raw!r} is not one of {', '.join(choices)}")
    return raw


def _bad(message: str) -> ElementError:
    return ElementError("InvalidConnectionParameter", message)
