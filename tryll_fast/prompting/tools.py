"""Tool calls: prompt text, JSON schema, GBNF grammar and the output parser (ToolSet).
The definitions and result values are in tool_spec.py, the lenient JSON reading in
tool_parse.py.

The ToolCall node (docs/workflow.md) offers tool definitions to the model, constrains
generation so a call is well-formed, and parses the output back into calls or a classified
failure.

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
from typing import Any, Iterable, Mapping, Sequence

from tryll_fast.prompting.chat import ChatFormatter, _get
from tryll_fast.prompting.tool_parse import (
    _Fail, _array_item_spans, _check_arguments, _decode, _failure, _object_member_spans,
    _skip_ws,
)
from tryll_fast.prompting.tool_spec import (  # noqa: F401 (the tool-call vocabulary)
    EXCERPT_BYTES, GENERIC, GENERIC_TOOL_BLOCK, HERMES, JSON_BARE, MISTRAL, MODES, PARAM_TYPES,
    _INSTRUCTIONS, CallIds, ParseFailure, ToolCall, ToolFormat, ToolGrammar, ToolParam,
    ToolParseResult, ToolPrompt, ToolSpec, detect_tool_format, mode_name, normalize_tools,
    tool_signature_lines,
)

__all__ = [
    "ToolParam", "ToolSpec", "ToolFormat", "GENERIC", "HERMES", "MISTRAL", "JSON_BARE",
    "detect_tool_format", "normalize_tools", "tool_signature_lines", "ToolSet",
    "ToolGrammar", "ToolPrompt", "ToolCall", "ParseFailure", "ToolParseResult", "CallIds",
    "MODES", "mode_name",
]


_GAP_RULE = '| " " | "\\n"'
# Lazy-grammar triggers. llama.cpp matches a pattern against all the text generated so far
# (anywhere in it, or the whole of it when the pattern is ^...$) and, on a match, feeds
# the grammar everything from the first group to the end, inside the sampler: text there
# the grammar rejects throws through its C API and aborts the process. So each pattern
# matches the whole text and ends where the grammar is sure to accept what came: the
# marker, then whitespace and the opening of a call, `{"name"` at most. A token running
# past that ("{\n\n", "{}") does not trigger; the call is then read leniently by the
# parser.
_GAP = r"(?: |\n)?"
_OPENING = r'\{ ?(?:"(?:n(?:a(?:m(?:e"?)?)?)?)?)?'
# A fenced code block whose body starts with JSON: group end = where the JSON starts.
_FENCE = re.compile(r"```[ \t]*(?:json|tool_call|tool_code|JSON)?[ \t]*\n?[ \t]*(?=[{\[])")
_NAMED = re.compile(r'[\[\s]*\{\s*"name"\s*:\s*"')
_CALL_OBJECT = re.compile(r'\{\s*"name"\s*:\s*"')


def _names_a_call(out: str, at: int) -> bool:
    """The JSON at `at` opens like a call: an object (or an array of them) whose first
    key is "name" with a string value."""
    return _NAMED.match(out, at) is not None


# A reasoning model's chain of thought (Qwen3, DeepSeek-R1 and their kin write it between
# these tags before the answer); one cut off by the token budget has no closing tag.
_THINK = re.compile(r"\A\s*<think>(.*?)(?:</think>|\Z)\s*", re.DOTALL)


def split_reasoning(text: str) -> tuple[str, str]:
    """(the chain of thought a reply opens with, the rest): the thought is reported
    (output.reasoning_content), never parsed for calls, shown or spoken."""
    m = _THINK.match(text)
    if m is None:
        return "", text
    return m.group(1).strip(), text[m.end():]


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
        # one call object alone: what a bare call opening the reply is held to
        conv.visit(conv.resolve_refs(self.call_schema(), "tools"), "call-object")
        body = conv.format_grammar()
        fmt = self.format
        lit = conv._format_literal
        block = "call-payload"
        if fmt.open_marker:
            block = f"{lit(fmt.open_marker)} gap call-payload gap"
            if fmt.close_marker:
                block += f" {lit(fmt.close_marker)}"
        # around the markers a line break, as the models write it ("<tool_call>\n{...}\n
        # </tool_call>"); inside the JSON one space at most, so no budget goes to indents
        rules = [body, f"call-block ::= {block}", f"gap ::= {_GAP_RULE}"]
        if self.parallel and fmt.blocks_for_parallel:
            rules.append("calls ::= call-block (gap call-block)*")
        else:
            rules.append("calls ::= call-block")
        lazy = mode != "require_call"
        root = "root ::= calls"
        if lazy and (fmt.open_marker or schema.get("type") == "array"):
            # a model that opens its reply with the call's JSON, markerless (the small Qwen
            # models do under CallOrAnswer), is held to the call's grammar from its "{"
            rules.append("bare-calls ::= call-object" + (
                " (gap call-object)*" if self.parallel else ""))
            root = "root ::= calls | bare-calls"
        gbnf = "\n".join(rules + [root]) + "\n"
        first = (fmt.open_marker or "{")[0]
        first_class = "[^" + ("\\" if first in "]^-\\" else "") + first + "]"
        eager = "\n".join(rules + [f"prose ::= {first_class} [^\\x00]*",
                                   "root ::= calls | prose"]) + "\n"
        # not "[": prose may open with "[laughs]"
        leading = r"^\s*(" + _OPENING + r")$"
        if fmt.open_marker:
            triggers = (r"^[\s\S]*?(" + re.escape(fmt.open_marker) + _GAP + "(?:" + _OPENING
                        + r")?)$", leading)
        else:
            triggers = (leading,)
        return ToolGrammar(gbnf=gbnf, lazy=lazy, trigger_patterns=triggers if lazy else (),
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
                                   failure=_failure(output, f.kind, f.reason, f.pos),
                                   prose=output[:self._call_start(output)].strip())
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
            found = self._unmarked(out)
            if found is None:
                raise _Fail("no_call", f"no tool-call marker {fmt.open_marker!r} in the "
                            "output", 0)
            return found
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

    def _call_start(self, out: str) -> int:
        """Where the first call attempt in `out` begins (len(out) when there is none): the
        marker, a JSON call opening the output, or a fenced block holding one."""
        at = [len(out)]
        if self.format.open_marker:
            m = out.find(self.format.open_marker)
            if m >= 0:
                at.append(m)
        start = _skip_ws(out, 0)
        if start < len(out) and out[start] in "{[" and _names_a_call(out, start):
            at.append(start)
        at += [f.start() for f in _FENCE.finditer(out) if _names_a_call(out, f.end())]
        at += [m.start() for m in _CALL_OBJECT.finditer(out)]
        return min(at)

    def _unmarked(self, out: str) -> tuple[str, list] | None:
        """A call written without the marker: a JSON call opening the output, or one in a
        fenced block (```json ... ```). Small models do both when the lazy grammar never
        saw its marker. None when no JSON there names a call; a JSON object that does
        ("name" as a string) is read strictly from then on, so a broken one is a
        malformed_call and never reaches the player as prose."""
        start = _skip_ws(out, 0)
        spans = []
        if start < len(out) and out[start] in "{[":
            spans.append((start, start, None))
        for fence in _FENCE.finditer(out):
            spans.append((fence.start(), fence.end(), fence))
        # after a sentence ("Sure! {"name": ...}"): an object whose first key is "name"
        spans += [(m.start(), m.start(), None) for m in _CALL_OBJECT.finditer(out)]
        for begin, j, fence in sorted(spans, key=lambda span: span[0]):
            if not _names_a_call(out, j):
                continue
            value, end = _decode(out, j)
            items = self._payload_items(out, value, j, end, first_block=True)
            calls = [self._validate(out, *it) for it in items]
            nxt = _skip_ws(out, end)
            while nxt < len(out) and _names_a_call(out, nxt):    # {...} {...}: parallel
                if not self.parallel:
                    raise _Fail("malformed_call", "a second call while parallel_tool_calls "
                                "is false", nxt)
                value, end = _decode(out, nxt)
                calls += [self._validate(out, *it)
                          for it in self._payload_items(out, value, nxt, end, False)]
                nxt = _skip_ws(out, end)
            stop = end
            if fence is not None:
                close = out.find("```", end)
                stop = close + 3 if close >= 0 else len(out)
            content = (out[:begin].strip() + "\n" + out[stop:].strip()).strip()
            return content, calls
        return None

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
