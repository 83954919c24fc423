"""Tool definitions and the values of a tool call: the spec a ToolCall node's tools
normalise to, the call syntaxes (formats) a chat template implies, what the prompt and the
grammar carry, and the parse results (calls, classified failures, diagnostics). Used by
tools.py (ToolSet) and tool_parse.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from tryll_fast.prompting.chat import GENERIC_CALL_CLOSE, GENERIC_CALL_OPEN, ChatFormatter, _get

PARAM_TYPES = ("string", "number", "integer", "boolean", "array", "object")
MODES = ("detect_only", "call_or_answer", "require_call")
EXCERPT_BYTES = 48


def mode_name(mode: Any) -> str:
    """'detect_only' | 'call_or_answer' | 'require_call' from a ToolCallMode, int or name."""
    if isinstance(mode, str):
        m = re.sub(r"(?<!^)(?=[A-Z])", "_", mode).lower()
        if m in MODES:
            return m
        raise ValueError(f"unknown tool-call mode {mode!r}")
    i = int(mode)
    if 0 <= i < len(MODES):
        return MODES[i]
    raise ValueError(f"unknown tool-call mode {mode!r}")


# --------------------------------------------------------------------------- definitions

@dataclass(frozen=True)
class ToolParam:
    name: str
    type: str
    description: str = ""
    required: bool = True
    enum: tuple = ()

    def schema(self) -> dict:
        s: dict[str, Any] = {"type": self.type}
        if self.description:
            s["description"] = self.description
        if self.enum:
            s["enum"] = list(self.enum)
        return s


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: tuple[ToolParam, ...]

    def parameters_schema(self) -> dict:
        return {"type": "object",
                "properties": {p.name: p.schema() for p in self.params},
                "required": [p.name for p in self.params if p.required],
                "additionalProperties": False}


def _enum_value(raw: str, ptype: str, where: str) -> Any:
    try:
        if ptype == "integer":
            return int(raw)
        if ptype == "number":
            return float(raw) if not re.fullmatch(r"-?\d+", raw) else int(raw)
        if ptype == "boolean":
            return {"true": True, "false": False}[raw.lower()]
    except (ValueError, KeyError):
        raise ValueError(f"{where}: enum value {raw!r} is not a {ptype}") from None
    if ptype in ("array", "object"):
        raise ValueError(f"{where}: enum_values are not supported for {ptype}")
    return raw


def normalize_tools(tools: Iterable[Any]) -> tuple[ToolSpec, ...]:
    """ToolSpecs from `codec.ToolDefinition` objects or dicts of the same shape
    ({name, description, parameters: [{name, type, description, required,
    enum_values|enum}]}). Raises ValueError on empty or duplicate names, unknown types."""
    specs = []
    seen = set()
    for t in tools:
        if isinstance(t, ToolSpec):
            specs.append(t)
            seen.add(t.name)
            continue
        name = _get(t, "name") or ""
        if not name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
            raise ValueError(f"tool name {name!r} must be non-empty [A-Za-z0-9_.-]")
        if name in seen:
            raise ValueError(f"duplicate tool name {name!r}")
        seen.add(name)
        params = []
        pnames = set()
        for p in _get(t, "parameters") or ():
            pname = _get(p, "name") or ""
            where = f"tool {name!r} parameter {pname!r}"
            if not pname or pname in pnames:
                raise ValueError(f"{where}: empty or duplicate parameter name")
            pnames.add(pname)
            ptype = (_get(p, "type") or "string").lower()
            if ptype not in PARAM_TYPES:
                raise ValueError(f"{where}: type {ptype!r} is not one of {PARAM_TYPES}")
            required = _get(p, "required")
            raw_enum = _get(p, "enum_values") or _get(p, "enum") or ()
            params.append(ToolParam(
                name=pname, type=ptype, description=_get(p, "description") or "",
                required=True if required is None else bool(required),
                enum=tuple(_enum_value(str(v), ptype, where) for v in raw_enum)))
        specs.append(ToolSpec(name=name, description=_get(t, "description") or "",
                              params=tuple(params)))
    return tuple(specs)


def tool_signature_lines(specs: Sequence[ToolSpec]) -> list[str]:
    """The ToolCall reference's parameters.tools[]: `search(query: string) - Search the
    web`, then an indented `query - What to search for` line per described parameter."""
    lines = []
    for s in specs:
        args = ", ".join(f"{p.name}{'' if p.required else '?'}: {p.type}" for p in s.params)
        lines.append(f"{s.name}({args})" + (f" - {s.description}" if s.description else ""))
        lines.extend(f"  {p.name} - {p.description}" for p in s.params if p.description)
    return lines


# --------------------------------------------------------------------------- formats

@dataclass(frozen=True)
class ToolFormat:
    name: str
    open_marker: str | None         # None: the format declares no marker (unclassified)
    close_marker: str | None
    via_template: bool              # tools go through the template's `tools` variable
    always_array: bool = False      # payload is a JSON array even for one call
    blocks_for_parallel: bool = False  # parallel = several marker blocks, one object each
    args_key: str = "arguments"


GENERIC = ToolFormat("generic", GENERIC_CALL_OPEN, GENERIC_CALL_CLOSE, via_template=False)
HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", via_template=True,
                    blocks_for_parallel=True)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", None, via_template=True, always_array=True)
JSON_BARE = ToolFormat("json", None, None, via_template=True, args_key="parameters")


def detect_tool_format(formatter: ChatFormatter | None) -> ToolFormat:
    """The call syntax a chat template implies (GENERIC when it has no tool support)."""
    if formatter is None or not formatter.supports_tools:
        return GENERIC
    src = formatter.template_source
    if "[TOOL_CALLS]" in src:
        return MISTRAL
    if "<tool_call>" in src:
        return HERMES
    return JSON_BARE


# --------------------------------------------------------------------------- prompt

GENERIC_TOOL_BLOCK = """\
# Tools
You can call these tools (JSON schema of each):
{tool_lines}
{instruction}
{call_open}{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}{call_close}
{parallel}"""

_INSTRUCTIONS = {
    "require_call": "You must call one of these tools. Reply with only:",
    "call_or_answer": ("If a tool helps, reply with only the call below; "
                       "otherwise answer normally:"),
    "detect_only": "If the user's request needs a tool, reply with only:",
}


@dataclass(frozen=True)
class ToolPrompt:
    """What the prompt carries: `template_tools` for templates that render `tools`,
    or `system_block` to append to the system message for those that do not."""
    template_tools: list[dict] | None
    system_block: str | None


@dataclass(frozen=True)
class ToolGrammar:
    """Grammar-constrained generation for one ToolCall execution.

    `gbnf` starts at the call marker (root rule `root`). If `lazy`, arm it only when a
    `trigger_patterns` regex (std::regex, full match; the grammar applies from its first
    capture group) matches the generated text; otherwise apply it from the first token.
    `eager_gbnf` accepts a call or prose and needs no lazy support."""
    gbnf: str
    lazy: bool
    trigger_patterns: tuple[str, ...]
    eager_gbnf: str
    schema: dict
    root: str = "root"


# --------------------------------------------------------------------------- parse results

@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments_json: str     # raw, as the model wrote it
    arguments: dict
    id: str                 # c%08x correlation id
    model_id: str | None = None  # an id the model wrote itself (Mistral), if any

    def to_dict(self) -> dict:
        """The diagnostics' output.tool_calls[] entry: `id` is the model's own id, present
        only when it wrote one; `call_id` is the server's, the one NodeEvents, tool
        results and the dialog correlate by."""
        d = {"name": self.name, "arguments_json": self.arguments_json, "call_id": self.id}
        if self.model_id:
            d["id"] = self.model_id
        return d


@dataclass(frozen=True)
class ParseFailure:
    kind: str       # malformed_call | no_call | unclassified
    reason: str
    offset: int     # byte offset into the UTF-8 output where the parser gave up
    excerpt: str    # up to 48 bytes of the output from `offset`

    @property
    def parse_error(self) -> str:
        quoted = json.dumps(self.excerpt, ensure_ascii=False)
        return f"{self.reason}; unparsed from byte {self.offset}: {quoted}"


@dataclass(frozen=True)
class ToolParseResult:
    calls: tuple[ToolCall, ...]
    text: str                       # plain content (the raw output on failure)
    failure: ParseFailure | None = None
    # on failure, what may reach the player: the output before its first call attempt
    # (all of it when there is none), so a broken call is never shown or spoken
    prose: str | None = None

    @property
    def parse_fallback(self) -> bool:
        return self.failure is not None

    def diagnostics(self) -> dict:
        """The `output.*` keys of the ToolCall reference's ToolCall diagnostics."""
        d: dict[str, Any] = {"parse_fallback": self.parse_fallback}
        if self.text:
            d["text"] = self.text
        if self.calls:
            d["tool_calls"] = [c.to_dict() for c in self.calls]
        if self.failure:
            d["parse_failure"] = self.failure.kind
            d["parse_error"] = self.failure.parse_error
        return d


class CallIds:
    """Correlation ids c00000000, c00000001, ... for one node execution."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def next(self) -> str:
        cid = f"c{self._next:08x}"
        self._next += 1
        return cid
