"""Graph builders and a turn runner over the raw protocol (tests/wire.py), shared by the
workflow tests. The fixtures are in conftest.py."""
from __future__ import annotations

from tryll_fast import codec

from wire import Wire

SMOL = "SmolLM2-135M-Instruct"
SYSTEM = "You are Brenna, the baker of Oakvale. Answer in one short sentence."


def node(name: str, params) -> codec.NodeDescription:
    return codec.NodeDescription(name=name, params=params)


def graph(*nodes, start: str | None = None) -> codec.GraphDescription:
    return codec.GraphDescription(nodes=list(nodes), start_node=start or nodes[0].name)


def gen(max_tokens: int = 16, system_prompt: str = SYSTEM, **kw) -> codec.GenerateParams:
    sampling = kw.pop("sampling", None) or codec.SamplingOverrides(temperature=0,
                                                                   max_tokens=max_tokens)
    return codec.GenerateParams(system_prompt=system_prompt, sampling=sampling, **kw)


def canned(*lines: str, **kw) -> codec.CannedResponseParams:
    return codec.CannedResponseParams(lines=[codec.LocalizableText(text=t) for t in lines], **kw)


def create(w: Wire, g, *, default_model: str = SMOL, **kw) -> int:
    reply = w.request(codec.CreateAgentRequest(request_id=w.rid(), graph=g,
                                               default_model_name=default_model, **kw))
    assert isinstance(reply, codec.CreateAgentResponse), reply
    return reply.agent_id


def create_error(w: Wire, g, code: int, *, default_model: str = SMOL, **kw):
    return w.expect_error(codec.CreateAgentRequest(request_id=w.rid(), graph=g,
                                                   default_model_name=default_model, **kw),
                          code)


def turn(w: Wire, agent_id: int, text: str, rid: int | None = None) -> list:
    """Send one message; every frame of the turn up to and including its TurnComplete."""
    rid = rid or w.rid()
    w.send(codec.SendMessageRequest(request_id=rid, agent_id=agent_id, text=text))
    frames = w.recv_until(codec.TurnComplete)
    assert frames[-1].request_id == rid and frames[-1].agent_id == agent_id
    return frames


def texts(frames, node_name: str | None = None) -> str:
    return "".join(f.text for f in frames if isinstance(f, codec.AnswerText)
                   and (node_name is None or f.node_name == node_name))
