"""The character frame (workflow.character_frame, prompting/character.py): it opens the
system message of Generate and GenerateAndSpeak, not of ToolCall or the classifiers, it
stays in the KV prefix agents share, and an empty setting turns it off."""
import json

import pytest

from tryll_fast import codec
from tryll_fast.prompting.character import CHARACTER_FRAME, framed

from flows import SMOL, create, gen, graph, node, turn
from wire import MODELS_DIR, Wire, start_server

pytestmark = pytest.mark.model
PERSONA = "You are Brenna, the baker of Oakvale. Answer in one short sentence."


def test_framed_puts_the_frame_first():
    assert framed("F", "P") == "F\n\nP" and framed("F", "") == "F" and framed("", "P") == "P"


@pytest.fixture(scope="module", params=["default", "off"])
def wire(request, model_file, tmp_path_factory):
    model_file(SMOL)
    extra = ["workflow.character_frame="] if request.param == "off" else []
    srv = start_server(tmp_path_factory.mktemp("frame"), models_dir=MODELS_DIR,
                       overrides=[f"workflow.default_llm={SMOL}", *extra])
    w = Wire(srv.address, timeout=120)
    w.create_session()
    yield request.param, w
    w.close()
    srv.shutdown(10)


def _nodes(frames) -> list[dict]:
    return json.loads(frames[-1].debug_info)["nodes"]


def test_generate_opens_with_the_frame_and_shares_it(wire):
    mode, w = wire
    prompts, shared = [], []
    for _ in range(2):                      # two agents, one persona
        aid = create(w, graph(node("answer", gen(max_tokens=4, system_prompt=PERSONA))),
                     enable_diagnostics=True)
        d = _nodes(turn(w, aid, "Hello!"))[0]
        prompts.append(d["prompt"])
        shared.append(d["tokens"]["shared_prefix"])
    system = prompts[0].split("<|im_end|>")[0]
    if mode == "default":
        assert system == f"<|im_start|>system\n{CHARACTER_FRAME}\n\n{PERSONA}"
        # the second agent attached the first one's system prefix, frame and persona
        assert shared[1] > len(CHARACTER_FRAME.split()) + len(PERSONA.split())
    else:
        assert system == f"<|im_start|>system\n{PERSONA}"


def test_tool_calls_and_classifiers_are_not_framed(wire):
    mode, w = wire
    tool = codec.ToolDefinition(name="open_door", description="Open the door.")
    g = graph(node("cls", codec.ClassifyIntentLLMParams(
                  intents_ids="greet,buy", found_exit="act", not_found_exit="act")),
              node("act", codec.ToolCallParams(
                  system_prompt=PERSONA, tools=[tool], mode=codec.ToolCallMode.RequireCall,
                  disposition=codec.ToolCallDisposition.RouteOnly,
                  sampling=codec.SamplingOverrides(max_tokens=24))))
    aid = create(w, g, enable_diagnostics=True)
    for d in _nodes(turn(w, aid, "Hello!")):
        assert CHARACTER_FRAME[:40] not in d["prompt"], (mode, d["node"])
