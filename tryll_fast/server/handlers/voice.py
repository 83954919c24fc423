"""The agent's voice (docs/voice.md): SetAgentVoice and SetAgentDeliveryMode.

SetAgentVoice runs on the session's lane: the new profile is checked and, when the graph
speaks, its model leased (loaded) before anything changes; then, under the agent's lock and
only while the agent is still idle, the voice is swapped and the old model's lease dropped.
Any failure leaves the old voice in place. The active delivery mode survives the swap when
the new profile has a mode of that name; otherwise the new default applies and Ack.warning
says so. SetAgentDeliveryMode answers on the reactor thread at any time: the agent's
speech picks it up from its next sentence.
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.models import ModelError
from tryll_fast.server.dispatch import handles
from tryll_fast.server.handlers.agents import agent_of, load_refused, voice_checker
from tryll_fast.workflow.voice import NEUTRAL, clamp_intensity


def _require_voice(agent) -> None:
    if agent.voice is None:
        raise TryllError(ErrorCode.AgentVoiceRequired,
                         f"agent {agent.id} was created without a voice "
                         "(CreateAgentRequest.voice)")


@handles("SetAgentVoiceRequest")
def set_agent_voice(session, req):
    agent = agent_of(session, req.agent_id)
    _require_voice(agent)
    with agent.lock:
        agent.admit("SetAgentVoiceRequest", "the voice changes only while the agent is idle")
    session.run_blocking(req.request_id, "SetAgentVoiceRequest",
                         lambda: _swap(session, agent, req), agent.id)


def _swap(session, agent, req):
    if req.voice is None:
        raise TryllError(ErrorCode.InvalidVoiceProfile, "voice: missing (SetAgentVoiceRequest "
                                                        "replaces the whole VoiceProfile)")
    speaks = agent.speaks
    voice = voice_checker(session)(req.voice, speaks)
    lease = None
    old_model = agent.voice.model
    needs_lease = speaks and voice.model and voice.model not in agent.leases
    if needs_lease:
        try:
            lease = session.server.models.lease(voice.model)     # the voice is ready first
        except ModelError as exc:
            raise load_refused(exc, ErrorCode.InvalidVoiceProfile,
                               f"voice.model_name: {voice.model!r} cannot be loaded") from None
    try:
        with agent.lock:
            agent.admit("SetAgentVoiceRequest", "a turn started before the voice changed")
            mode, intensity = agent.delivery.get()
            kept = voice.mode_for(mode)
            agent.voice = voice
            agent.delivery.set(kept, intensity if kept == mode else 1.0)
            if lease is not None:
                agent.leases[voice.model] = lease
                lease = None
            old = (agent.leases.pop(old_model, None)
                   if old_model and old_model != voice.model else None)
    finally:
        if lease is not None:
            lease.release()
    if old is not None:
        old.release()
    warning = ""
    if kept != mode:        # neutral too: no profile defines it as a mode of its own
        warning = (f"delivery mode {mode or NEUTRAL!r} is not in the new voice; now "
                   f"{kept or NEUTRAL!r} (its default_delivery_mode)")
    return codec.Ack(request_id=req.request_id, agent_id=agent.id, warning=warning)


@handles("SetAgentDeliveryModeRequest")
def set_delivery_mode(session, req):
    agent = agent_of(session, req.agent_id)
    _require_voice(agent)
    with agent.lock:
        agent.admit("SetAgentDeliveryModeRequest")
        mode = "" if req.mode in ("", NEUTRAL) else req.mode
        if mode and mode not in agent.voice.modes:
            raise TryllError(ErrorCode.UnknownDeliveryMode,
                             f"agent {agent.id} has no delivery mode {req.mode!r} (modes: "
                             f"{', '.join([NEUTRAL, *agent.voice.modes])}); the current mode "
                             "stays")
        agent.delivery.set(mode, clamp_intensity(req.intensity))
    return codec.Ack(request_id=req.request_id, agent_id=agent.id)
