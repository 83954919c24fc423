"""Tool calls: prompt text, JSON schema, GBNF grammar and the output parser.

The ToolCall node (seed 003) offers tool definitions to the model, constrains generation
so a call is well-formed, and parses the output back into calls or a classified failure.

Formats (`ToolFormat`) say how a model writes a call:
  generic     the chat template has no tool support (SmolLM2, the Gemma fallback): the
              tools are described in a system-prompt block (`GENERIC_TOOL_BLOCK`) and a
              call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; with
              parallel calls the payload is a JSON array of such objects.
  hermes      the template renders `tools` and uses <tool_call> (Qwen 2.5, Hermes):
              one object per block, several blocks for parallel calls.
  mistral     `[TOOL_CALLS][{...}, ...]`: always an array, no closing marker.
  json        the template renders `tools` but declares no call marker (Llama 3.x: a
              bare JSON object with "parameters"): failures are `unclassified`.
The parser reads every variant leniently (object or array payload, several blocks, a
missing closing marker at the end of the output); the grammar writes the strict one.

Grammar per mode (`ToolSet.grammar`):
  RequireCall               eager: the whole output is one call block.
  CallOrAnswer, DetectOnly  lazy: free text until the call marker appears, then the same
                            grammar from the marker on (llama.cpp's
                            `llama_sampler_init_grammar_lazy_patterns` with
                            `trigger_patterns`). Prose costs nothing extra (constrained
                            sampling is ~30 ms/token on 2 cores) and a started call is
                            still well-formed. `eager_gbnf` (call | prose that does not
                            start with the marker) is there for samplers without lazy
                            grammars. DetectOnly discards the prose; the node may cap
                            max_tokens. A markerless format triggers on a leading "{".

Call ids are `c%08x`, counted per node execution from c00000000 (`CallIds`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tryll_fast.engines.llama.chat import (
    GENERIC_CALL_CLOSE, GENERIC_CALL_OPEN, ChatFormatter, _get,
)

__all__ = [
    "ToolParam", "ToolSpec", "ToolFormat", "GENERIC", "HERMES", "MISTRAL", "JSON_BARE",
    "detect_tool_format", "normalize_tools", "tool_signature_lines", "ToolSet",
    "ToolGrammar", "ToolPrompt", "ToolCall", "ParseFailure", "ToolParseResult", "CallIds",
    "MODES", "mode_name",
]

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
    """Seed 003's parameters.tools[]: `search(query: string) - Search the web`, then an
    indented `query - What to search for` line per described parameter."""
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
        d = {"name": self.name, "arguments_json": self.arguments_json, "id": self.id}
        if self.model_id:
            d["model_id"] = self.model_id
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

    @property
    def parse_fallback(self) -> bool:
        return self.failure is not None

    def diagnostics(self) -> dict:
        """The `output.*` keys of seed 003's ToolCall diagnostics."""
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


class _Fail(Exception):
    def __init__(self, kind: str, reason: str, pos: int) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.pos = kind, reason, pos


# --------------------------------------------------------------------------- the tool set

class ToolSet:
    """The tools of one ToolCall node for one model: prompt, schema, grammar, parser."""

    def __init__(self, tools: Iterable[Any], *, formatter: ChatFormatter | None = None,
                 fmt: ToolFormat | None = None, parallel_tool_calls: bool = False) -> None:
        self.specs = normalize_tools(tools)
        if not self.specs:
            raise ValueError("a ToolCall needs at least one tool definition")
        self.by_name = {s.name: s for s in self.specs}
        self.formatter = formatter
        self.format = fmt or detect_tool_format(formatter)
        self.parallel = parallel_tool_calls

    # ---- (a) prompt

    def template_tools(self) -> list[dict]:
        """OpenAI-style function specs for a template's `tools` variable."""
        return [{"type": "function",
                 "function": {"name": s.name, "description": s.description,
                              "parameters": s.parameters_schema()}} for s in self.specs]

    def prompt(self, mode: Any = "require_call") -> ToolPrompt:
        if self.format.via_template:
            return ToolPrompt(template_tools=self.template_tools(), system_block=None)
        lines = "\n".join(json.dumps({"name": s.name, "description": s.description,
                                      "parameters": s.parameters_schema()},
                                     ensure_ascii=False) for s in self.specs)
        parallel = ("To call several tools at once, put a JSON array of calls in one "
                    f"{self.format.open_marker} block.\n" if self.parallel else "")
        block = GENERIC_TOOL_BLOCK.format(
            tool_lines=lines, instruction=_INSTRUCTIONS[mode_name(mode)],
            call_open=self.format.open_marker, call_close=self.format.close_marker or "",
            parallel=parallel)
        return ToolPrompt(template_tools=None, system_block=block.rstrip("\n"))

    def apply(self, messages: Sequence[Any], mode: Any = "require_call"
              ) -> tuple[list[Any], list[dict] | None]:
        """`messages` with the tool block merged into the (first) system message, and
        the `tools` argument for `ChatFormatter.render`. The block sits in the system
        part so it is inside the stable prefix whose KV agents share."""
        p = self.prompt(mode)
        msgs = list(messages)
        if p.system_block is None:
            return msgs, p.template_tools
        if msgs and _get(msgs[0], "role") == "system":
            first = dict(msgs[0]) if isinstance(msgs[0], Mapping) else {
                k: _get(msgs[0], k) for k in ("role", "content", "name")}
            content = _get(first, "content") or ""
            first["content"] = f"{content}\n\n{p.system_block}" if content else p.system_block
            msgs[0] = first
        else:
            msgs.insert(0, {"role": "system", "content": p.system_block})
        return msgs, None

    # ---- (b) schema

    def call_schema(self) -> dict:
        """JSON schema of one call: {"name": <const>, "<args_key>": {...}}."""
        key = self.format.args_key
        alts = [{"type": "object",
                 "properties": {"name": {"const": s.name}, key: s.parameters_schema()},
                 "required": ["name", key], "additionalProperties": False}
                for s in self.specs]
        return alts[0] if len(alts) == 1 else {"oneOf": alts}

    def schema(self) -> dict:
        """The payload schema after the marker: a call, or an array of calls."""
        call = self.call_schema()
        if self.format.always_array or (self.parallel and not self.format.blocks_for_parallel):
            arr = {"type": "array", "items": call, "minItems": 1}
            if not self.parallel:
                arr["maxItems"] = 1
            return arr
        return call

    # ---- (c) grammar

    def grammar(self, mode: Any) -> ToolGrammar:
        from llama_cpp.llama_grammar import SchemaConverter

        mode = mode_name(mode)
        schema = self.schema()
        conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                               raw_pattern=False)
        conv.visit(conv.resolve_refs(schema, "tools"), "call-payload")
        body = conv.format_grammar()
        fmt = self.format
        lit = conv._format_literal
        block = "call-payload"
        if fmt.open_marker:
            block = f"{lit(fmt.open_marker)} space call-payload space"
            if fmt.close_marker:
                block += f" {lit(fmt.close_marker)}"
        rules = [body, f"call-block ::= {block}"]
        if self.parallel and fmt.blocks_for_parallel:
            rules.append("calls ::= call-block (space call-block)*")
        else:
            rules.append("calls ::= call-block")
        gbnf = "\n".join(rules + ["root ::= calls"]) + "\n"
        first = (fmt.open_marker or "{")[0]
        first_class = "[^" + ("\\" if first in "]^-\\" else "") + first + "]"
        eager = "\n".join(rules + [f"prose ::= {first_class} [^\\x00]*",
                                   "root ::= calls | prose"]) + "\n"
        if fmt.open_marker:
            trigger = r"[\s\S]*?(" + re.escape(fmt.open_marker) + r")[\s\S]*"
        else:
            trigger = r"\s*(\{)[\s\S]*"
        lazy = mode != "require_call"
        return ToolGrammar(gbnf=gbnf, lazy=lazy, trigger_patterns=(trigger,) if lazy else (),
                           eager_gbnf=eager, schema=schema)

    # ---- parser

    def parse(self, output: str, ids: CallIds | None = None) -> ToolParseResult:
        """Calls in `output`, or a classified failure (then no call, text = output).

        Ids are taken from `ids` (the node execution's counter) only when the whole
        output parses, so a failed parse consumes none."""
        try:
            content, raw_calls = self._parse(output)
        except _Fail as f:
            return ToolParseResult(calls=(), text=output,
                                   failure=_failure(output, f.kind, f.reason, f.pos))
        ids = ids or CallIds()
        calls = tuple(ToolCall(name=n, arguments_json=aj, arguments=a, id=ids.next(),
                               model_id=mid) for n, aj, a, mid in raw_calls)
        return ToolParseResult(calls=calls, text=content)

    def _parse(self, out: str) -> tuple[str, list]:
        fmt = self.format
        if not out.strip():
            raise _Fail("no_call" if fmt.open_marker else "unclassified", "empty output", 0)
        if not fmt.open_marker:
            start = len(out) - len(out.lstrip())
            if out[start] not in "{[":
                raise _Fail("unclassified", "the chat template declares no tool-call "
                            "marker and the output is not a JSON call", start)
            try:
                value, end = _decode(out, start)
            except _Fail as f:
                raise _Fail("unclassified", f.reason, f.pos) from None
            items = self._payload_items(out, value, start, end, first_block=True)
            calls = [self._validate(out, *it) for it in items]
            rest = out[end:].strip()
            return rest, calls
        m = out.find(fmt.open_marker)
        if m < 0:
            raise _Fail("no_call", f"no tool-call marker {fmt.open_marker!r} in the output", 0)
        content = out[:m]
        calls = []
        pos = m
        n_blocks = 0
        while True:
            n_blocks += 1
            if n_blocks > 1 and not self.parallel:
                raise _Fail("malformed_call", "a second call while parallel_tool_calls is "
                            "false", pos)
            j = _skip_ws(out, pos + len(fmt.open_marker))
            if j >= len(out):
                raise _Fail("malformed_call", "the call marker is not followed by a call", pos)
            if out[j] not in "{[":
                raise _Fail("malformed_call", "expected a JSON object or array after the "
                            "call marker", j)
            value, end = _decode(out, j)
            items = self._payload_items(out, value, j, end, first_block=n_blocks == 1)
            calls.extend(self._validate(out, *it) for it in items)
            pos = _skip_ws(out, end)
            if fmt.close_marker:
                if out.startswith(fmt.close_marker, pos):
                    pos = _skip_ws(out, pos + len(fmt.close_marker))
                elif pos < len(out):
                    raise _Fail("malformed_call", f"expected {fmt.close_marker!r} after the "
                                "call", pos)
                # else: output ended (stop string or max_tokens) right after the call
            if not out.startswith(fmt.open_marker, pos):
                break
        trailing = out[pos:].strip()
        if trailing:
            content = (content.rstrip() + "\n" + trailing).strip() if content.strip() else trailing
        return content.strip(), calls

    def _payload_items(self, out: str, value: Any, start: int, end: int,
                       first_block: bool) -> list[tuple[Any, int, int]]:
        """(call object, start, end) for each call in a decoded payload."""
        if isinstance(value, dict):
            return [(value, start, end)]
        if not isinstance(value, list):
            raise _Fail("malformed_call", "the call is not a JSON object", start)
        if not value:
            raise _Fail("malformed_call", "empty list of calls", start)
        spans = _array_item_spans(out, start)
        if len(value) > 1 and not self.parallel:
            raise _Fail("malformed_call", "several calls while parallel_tool_calls is false",
                        spans[1][0])
        return [(v, s, e) for v, (s, e) in zip(value, spans)]

    def _validate(self, out: str, call: Any, start: int, end: int):
        if not isinstance(call, dict):
            raise _Fail("malformed_call", "a call is not a JSON object", start)
        members = _object_member_spans(out, start)
        name = call.get("name")
        if not isinstance(name, str):
            raise _Fail("malformed_call", 'the call has no string "name"', start)
        spec = self.by_name.get(name)
        if spec is None:
            raise _Fail("malformed_call", f"unknown tool {name!r}", members["name"][0])
        key = next((k for k in ("arguments", "parameters", "args") if k in call), None)
        if key is None:
            if any(p.required for p in spec.params):
                raise _Fail("malformed_call", f"tool {name!r}: no arguments", start)
            args, args_json, astart = {}, "{}", start
        else:
            args = call[key]
            astart, aend = members[key]
            args_json = out[astart:aend]
            if isinstance(args, str):  # some models write the arguments as JSON text
                try:
                    args = json.loads(args)
                except ValueError:
                    raise _Fail("malformed_call", f"tool {name!r}: arguments string is not "
                                "JSON", astart) from None
                args_json = call[key]
            if not isinstance(args, dict):
                raise _Fail("malformed_call", f"tool {name!r}: arguments are not a JSON "
                            "object", astart)
        _check_arguments(spec, args, astart, out, key is not None)
        mid = call.get("id")
        return name, args_json, args, mid if isinstance(mid, str) else None


# --------------------------------------------------------------------------- helpers

_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _check_arguments(spec: ToolSpec, args: dict, astart: int, out: str, spans_ok: bool):
    members = {}
    if spans_ok and out[astart:astart + 1] == "{":
        members = _object_member_spans(out, astart)
    params = {p.name: p for p in spec.params}
    for p in spec.params:
        if p.required and p.name not in args:
            raise _Fail("malformed_call", f"tool {spec.name!r}: missing required argument "
                        f"{p.name!r}", astart)
    for k, v in args.items():
        at = members.get(k, (astart, 0))[0]
        p = params.get(k)
        if p is None:
            raise _Fail("malformed_call", f"tool {spec.name!r}: unexpected argument {k!r}", at)
        if not _TYPE_CHECKS[p.type](v):
            raise _Fail("malformed_call", f"tool {spec.name!r}: argument {k!r} is not a "
                        f"{p.type}", at)
        if p.enum and v not in p.enum:
            raise _Fail("malformed_call", f"tool {spec.name!r}: argument {k!r} = {v!r} is "
                        f"not one of {list(p.enum)}", at)


_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _decode(s: str, i: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(s, i)
    except json.JSONDecodeError as e:
        if e.pos >= len(s):
            raise _Fail("malformed_call", "the call's JSON is truncated (output ended)",
                        e.pos) from None
        raise _Fail("malformed_call", f"invalid JSON in the call: {e.msg}", e.pos) from None


def _object_member_spans(s: str, i: int) -> dict[str, tuple[int, int]]:
    """key -> (start, end) of each top-level value of the (valid) JSON object at s[i]."""
    spans = {}
    i = _skip_ws(s, i + 1)
    while i < len(s) and s[i] != "}":
        key, i = _DECODER.raw_decode(s, i)
        i = _skip_ws(s, i)
        i = _skip_ws(s, i + 1)  # ':'
        _, end = _DECODER.raw_decode(s, i)
        spans[key] = (i, end)
        i = _skip_ws(s, end)
        if i < len(s) and s[i] == ",":
            i = _skip_ws(s, i + 1)
    return spans


def _array_item_spans(s: str, i: int) -> list[tuple[int, int]]:
    spans = []
    i = _skip_ws(s, i + 1)
    while i < len(s) and s[i] != "]":
        _, end = _DECODER.raw_decode(s, i)
        spans.append((i, end))
        i = _skip_ws(s, end)
        if i < len(s) and s[i] == ",":
            i = _skip_ws(s, i + 1)
    return spans


def _failure(out: str, kind: str, reason: str, pos: int) -> ParseFailure:
    offset = len(out[:pos].encode("utf-8"))
    excerpt = out.encode("utf-8")[offset:offset + EXCERPT_BYTES].decode("utf-8", "ignore")
    return ParseFailure(kind=kind, reason=reason, offset=offset, excerpt=excerpt)
