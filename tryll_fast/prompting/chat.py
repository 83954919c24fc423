"""Chat prompts rendered with the model's own chat template.

A GGUF file carries its chat template as Jinja source under `tokenizer.chat_template`.
`ChatFormatter` renders a message list with it in a sandboxed Jinja environment that
provides what Hugging Face templates expect (`raise_exception`, `strftime_now`,
`bos_token`, `eos_token`, `add_generation_prompt`, `tools`, a `tojson` that does not
HTML-escape). A model without a template gets an entry of `FALLBACK_TEMPLATES` chosen by
`general.architecture` / `general.name`; a model that has neither raises
`ChatTemplateError` (llama-cpp-python silently falls back to the llama-2 format there,
which produces a prompt the model was never trained on).

Messages are dicts (or objects with the same attributes):
    {"role": "system" | "user" | "assistant" | "tool", "content": str | None,
     "tool_calls": [{"name", "arguments" (dict or JSON text), "id"}]   # assistant only
     "name": str, "tool_call_id": str}                                   # tool only

Tokenization contract: `render()` returns text to tokenize with `parse_special=True`
and `add_special=formatter.add_bos`; a leading BOS the template writes itself is
stripped when the tokenizer adds one anyway, so BOS never appears twice.

Also here: per-message token counts (`message_spans`) and the stable prefix
(`stable_prefix`) whose KV the engine shares between agents.
"""
from __future__ import annotations

import datetime
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = [
    "ChatTemplateError", "ChatFormatter", "FallbackTemplate", "FALLBACK_TEMPLATES",
    "MessageSpan", "StablePrefix", "read_gguf_metadata", "normalize_messages",
    "GENERIC_CALL_OPEN", "GENERIC_CALL_CLOSE",
]

# The call syntax used when a template has no tool support of its own (see tools.py).
# Defined here because rendering historical assistant tool_calls needs it too.
GENERIC_CALL_OPEN = "<tool_call>"
GENERIC_CALL_CLOSE = "</tool_call>"

ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """No usable chat template, or the template rejected the conversation."""


# --------------------------------------------------------------------------- GGUF header

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The key/value metadata of a GGUF file, without loading the model.

    Strings and scalars are returned as Python values. Arrays are returned as
    `("array", element_type, count)` except that the BOS/EOS token strings are
    resolved from `tokenizer.ggml.tokens` into the synthetic keys
    `tokenizer.ggml.bos_token` / `tokenizer.ggml.eos_token` (templates need the text).
    Reads only the header (well under a second even for a 262k-token vocabulary).
    """
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ChatTemplateError(f"{path}: not a GGUF file")
        version, = struct.unpack("<I", f.read(4))
        if version < 2:
            raise ChatTemplateError(f"{path}: GGUF version {version} is not supported")
        _n_tensors, n_kv = struct.unpack("<QQ", f.read(16))

        def read_str() -> str:
            n, = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", "replace")

        def skip_str() -> None:
            n, = struct.unpack("<Q", f.read(8))
            f.seek(n, 1)

        meta: dict[str, Any] = {}
        tokens_at = None  # (file offset of first element, count)
        for _ in range(n_kv):
            key = read_str()
            vtype, = struct.unpack("<I", f.read(4))
            if vtype == _GGUF_STRING:
                meta[key] = read_str()
            elif vtype == _GGUF_ARRAY:
                etype, count = struct.unpack("<IQ", f.read(12))
                meta[key] = ("array", etype, count)
                if etype == _GGUF_STRING:
                    if key == "tokenizer.ggml.tokens":
                        tokens_at = (f.tell(), count)
                    for _ in range(count):
                        skip_str()
                elif etype in _GGUF_SCALARS:
                    f.seek(struct.calcsize(_GGUF_SCALARS[etype]) * count, 1)
                else:
                    raise ChatTemplateError(f"{path}: nested GGUF array under {key!r}")
            elif vtype in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[vtype]
                meta[key], = struct.unpack(fmt, f.read(struct.calcsize(fmt)))
            else:
                raise ChatTemplateError(f"{path}: unknown GGUF value type {vtype} at {key!r}")

        wanted = {meta[k]: k for k in ("tokenizer.ggml.bos_token_id",
                                       "tokenizer.ggml.eos_token_id") if k in meta}
        if tokens_at and wanted:
            f.seek(tokens_at[0])
            last = max(wanted)
            for i in range(min(tokens_at[1], last + 1)):
                if i in wanted:
                    meta[wanted[i].replace("_id", "")] = read_str()
                else:
                    skip_str()
    return meta


# --------------------------------------------------------------------------- fallbacks

@dataclass(frozen=True)
class FallbackTemplate:
    """A chat template for models whose GGUF metadata carries none."""
    name: str
    architectures: tuple[str, ...]
    name_contains: tuple[str, ...]
    source: str
    stop_strings: tuple[str, ...]
    note: str

    def matches(self, architecture: str, model_name: str) -> bool:
        lname = model_name.lower()
        return architecture in self.architectures or any(s in lname for s in self.name_contains)


# Gemma's turn format, as in the instruction-tuned Gemma 3 template: no system role
# (the system text opens the first user turn), "model" for the assistant, tool results
# as user turns. Tool calls are written in the generic <tool_call> syntax (tools.py).
_GEMMA_TURNS = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- if first_user_prefix and not loop_messages -%}"
    "{{ '<start_of_turn>user\n' + first_user_prefix }}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

FALLBACK_TEMPLATES: tuple[FallbackTemplate, ...] = (
    FallbackTemplate(
        name="gemma-turns",
        architectures=("gemma", "gemma2", "gemma3"),
        name_contains=("gemma",),
        source=_GEMMA_TURNS,
        stop_strings=("<end_of_turn>",),
        note="Gemma turn format. A base (pre-trained only) Gemma such as Gemma 3 270M "
             "was never trained on it and follows it loosely: expect continuations "
             "rather than answers, and no reliable tool calls without a grammar.",
    ),
)


# --------------------------------------------------------------------------- messages

def _get(obj: Any, key: str, default: Any = None) -> Any:
    # dict first: isinstance against typing.Mapping is an ABC check, slow per field
    if type(obj) is dict or isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _call_arguments(call: Any) -> dict:
    args = _get(call, "arguments", None)
    if args is None:
        args = _get(call, "arguments_json", None)
    if args is None or args == "":
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as e:
            raise ChatTemplateError(f"tool call arguments are not JSON: {e}") from None
    if not isinstance(args, Mapping):
        raise ChatTemplateError("tool call arguments must be a JSON object")
    return dict(args)


def normalize_messages(messages: Iterable[Any]) -> list[dict]:
    """Messages as plain dicts in the Hugging Face / OpenAI shape templates expect."""
    out = []
    for i, m in enumerate(messages):
        role = _get(m, "role")
        if role not in ROLES:
            raise ChatTemplateError(f"message {i}: role {role!r} is not one of {ROLES}")
        content = _get(m, "content")
        msg: dict[str, Any] = {"role": role, "content": "" if content is None else str(content)}
        calls = _get(m, "tool_calls")
        if calls:
            if role != "assistant":
                raise ChatTemplateError(f"message {i}: only assistant messages carry tool_calls")
            msg["tool_calls"] = [
                {"id": _get(c, "id") or f"c{j:08x}", "type": "function",
                 "function": {"name": _get(c, "name"), "arguments": _call_arguments(c)}}
                for j, c in enumerate(calls)]
        for key in ("name", "tool_call_id"):
            v = _get(m, key)
            if v:
                msg[key] = v
        out.append(msg)
    return out


def _generic_call_text(tool_calls: list[dict]) -> str:
    return "".join(
        GENERIC_CALL_OPEN
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                     ensure_ascii=False)
        + GENERIC_CALL_CLOSE for c in tool_calls)


# --------------------------------------------------------------------------- formatter

@dataclass(frozen=True)
class MessageSpan:
    """What one message contributes to the rendered prompt.

    `index` is the message index, or -1 for the generation prompt (the assistant
    header after the last message). `start`/`end` are character offsets into the
    rendered prompt; `n_tokens` is filled when a tokenizer was given.
    """
    index: int
    role: str
    start: int
    end: int
    n_tokens: int | None = None


@dataclass(frozen=True)
class StablePrefix:
    """The rendered leading part that does not depend on the conversation.

    `text == prompt[:end]` for every conversation with the same system messages and
    tools; the engine tokenizes it and shares its KV cells between agents.
    """
    text: str
    end: int
    n_tokens: int | None = None


def _lcp(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatFormatter:
    """Renders conversations into prompt text with one model's chat template."""

    def __init__(self, template: str, *, bos_token: str = "", eos_token: str = "",
                 add_bos: bool = False, source: str = "explicit",
                 stop_strings: Sequence[str] = (), note: str = "") -> None:
        import jinja2
        import jinja2.meta
        import jinja2.sandbox

        self.template_source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.source = source
        self.note = note
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        try:
            ast = env.parse(template)
            self._template = env.from_string(template)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template ({source}) does not parse: {e}") from None
        variables = jinja2.meta.find_undeclared_variables(ast)
        #: The template renders tool definitions itself (Qwen, Hermes, Llama 3.1...).
        self.supports_tools = "tools" in variables
        #: The template renders assistant tool_calls (else they are folded into content).
        self.renders_tool_calls = "tool_calls" in template
        #: The template knows the tool role (else tool results become user turns).
        self.knows_tool_role = "tool" in template.replace("tool_calls", "").replace("tools", "")
        stops = list(stop_strings)
        if eos_token and eos_token not in stops:
            stops.append(eos_token)
        for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
            if marker in template and marker not in stops:
                stops.append(marker)
        #: Strings that end an assistant turn (the engine stops generation on them).
        self.stop_strings = tuple(stops)

    # ---- construction

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, *, template: str | None = None) -> ChatFormatter:
        """The formatter for a GGUF file (reads its header only)."""
        return cls.from_metadata(read_gguf_metadata(path), template=template,
                                 origin=os.fspath(path))

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], *, template: str | None = None,
                      origin: str = "") -> ChatFormatter:
        """The formatter for GGUF metadata (as `read_gguf_metadata` gives it, or an engine
        reads it from a loaded model). `template` overrides the metadata."""
        bos = meta.get("tokenizer.ggml.bos_token", "") or ""
        eos = meta.get("tokenizer.ggml.eos_token", "") or ""
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        if template is not None:
            return cls(template, bos_token=bos, eos_token=eos, add_bos=add_bos)
        src = meta.get("tokenizer.chat_template")
        if isinstance(src, str) and src.strip():
            return cls(src, bos_token=bos, eos_token=eos, add_bos=add_bos, source="gguf")
        arch = str(meta.get("general.architecture", "") or "")
        name = str(meta.get("general.name", "") or "")
        for fb in FALLBACK_TEMPLATES:
            if fb.matches(arch, name):
                return cls(fb.source, bos_token=bos, eos_token=eos, add_bos=add_bos,
                           source=f"fallback:{fb.name}", stop_strings=fb.stop_strings,
                           note=fb.note)
        raise ChatTemplateError(
            f"model {name or origin or '?'!r} (architecture {arch or '?'!r}) has no "
            "tokenizer.chat_template in its GGUF metadata and no entry in "
            "tryll_fast.prompting.chat.FALLBACK_TEMPLATES; add one there or pass "
            "template= explicitly (no silent llama-2 fallback)")

    # ---- rendering

    def _prepare(self, messages: Iterable[Any]) -> list[dict]:
        msgs = normalize_messages(messages)
        for m in msgs:
            if m.get("tool_calls") and not self.renders_tool_calls:
                m["content"] = m["content"] + _generic_call_text(m.pop("tool_calls"))
            if m["role"] == "tool" and not self.knows_tool_role:
                label = m.get("name") or "tool"
                m["role"] = "user"
                m["content"] = f"[{label} result] {m['content']}"
        return msgs

    def _render_prepared(self, msgs: list[dict], add_generation_prompt: bool,
                         tools: list[dict] | None, extra: Mapping[str, Any]) -> str:
        import jinja2
        kwargs = dict(extra)
        if tools:
            kwargs["tools"] = tools
        try:
            text = self._template.render(
                messages=msgs, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template ({self.source}) failed: {e}") from None
        if self.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        return text

    def render(self, messages: Iterable[Any], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, **extra: Any) -> str:
        """Prompt text for `messages`.

        `tools` are OpenAI-style function specs (`tools.template_tools()` builds them);
        they are passed to the template's `tools` variable, which only templates with
        `supports_tools` read (`tools.build_tool_prompt` handles the others).
        """
        return self._render_prepared(self._prepare(messages), add_generation_prompt,
                                     tools, extra)

    def message_spans(self, messages: Sequence[Any], *,
                      tokenize: Callable[[str], Sequence[int]] | None = None,
                      add_generation_prompt: bool = True,
                      tools: list[dict] | None = None, **extra: Any) -> list[MessageSpan]:
        """What each message contributes to `render(messages)`: offsets and tokens.

        Message i ends where the rendering of messages[:i+1] stops agreeing with the
        full rendering, so template-injected text (a default system prompt, separators)
        is charged to the message that caused it and the spans tile the prompt. Token
        counts telescope over prefixes of the full prompt, so they sum exactly to
        `len(tokenize(prompt))`; the last span (index -1) is the generation prompt.
        """
        msgs = self._prepare(messages)
        full = self._render_prepared(msgs, add_generation_prompt, tools, extra)
        bounds = []
        prev = 0
        for i in range(1, len(msgs) + 1):
            try:
                part = self._render_prepared(msgs[:i], False, tools, extra)
                b = max(prev, _lcp(part, full))
            except ChatTemplateError:
                b = prev  # templates that reject partial conversations: merge forward
            bounds.append(b)
            prev = b
        if msgs and not add_generation_prompt:
            bounds[-1] = len(full)
        spans = []
        start = 0
        n_prev = 0
        for i, end in enumerate(bounds + ([len(full)] if add_generation_prompt else [])):
            n = None
            if tokenize is not None:
                n_here = len(tokenize(full[:end])) if end else 0
                n, n_prev = n_here - n_prev, n_here
            is_gen = i == len(msgs)
            spans.append(MessageSpan(index=-1 if is_gen else i,
                                     role="generation_prompt" if is_gen else msgs[i]["role"],
                                     start=start, end=end, n_tokens=n))
            start = end
        return spans

    def count_tokens(self, messages: Sequence[Any], tokenize: Callable[[str], Sequence[int]],
                     **kwargs: Any) -> list[int]:
        """Tokens per message (plus a last entry for the generation prompt)."""
        return [s.n_tokens for s in self.message_spans(messages, tokenize=tokenize, **kwargs)]

    def stable_prefix(self, messages: Sequence[Any], *,
                      tokenize: Callable[[str], Sequence[int]] | None = None,
                      tools: list[dict] | None = None, **extra: Any) -> StablePrefix:
        """The rendered system part shared by every conversation with the same
        leading system messages (and tools), and its end offset in the prompt.

        Found by rendering the system messages followed by two different probe user
        messages and keeping what they agree on, then cutting back to the last newline
        so the prefix ends on a token boundary. Offsets are
        characters of `render(messages)`; `n_tokens` counts `tokenize(text)`.
        """
        msgs = self._prepare(messages)
        n_sys = 0
        while n_sys < len(msgs) and msgs[n_sys]["role"] == "system":
            n_sys += 1
        system = msgs[:n_sys]
        probes = [self._render_prepared(system + [{"role": "user", "content": p}], False,
                                        tools, extra)
                  for p in ("\x01probe-A\x01", "\x02probe-B\x02")]
        end = _lcp(*probes)
        if msgs:
            end = min(end, _lcp(probes[0], self._render_prepared(msgs, True, tools, extra)))
        text = probes[0][:end]
        # Cut back to just after a newline: template headers end with one, and BPE /
        # SentencePiece vocabularies do not merge a newline with the text after it.
        cut = text.rfind("\n") + 1
        if cut < end:
            text, end = text[:cut], cut
        n = None
        if tokenize is not None:
            n = len(tokenize(text)) if text else 0
        return StablePrefix(text=text, end=end, n_tokens=n)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False, ensure_ascii: bool = False) -> str:
    # Jinja's own tojson HTML-escapes <, >, & and ' which corrupts prompts.
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                      ensure_ascii=ensure_ascii)
