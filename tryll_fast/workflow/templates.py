"""Mustache templates (pystache) for prompts and instructions.

Keys (docs/workflow.md): `var.<name>` (the variable's value now: re-read on every render),
`instruction_<name>` and the `instructions` section ({name, text} per instruction attached
so far in the turn), `locale` ("pt-BR"), `language_code` ("pt"), `language` ("Portuguese"),
`user_message` (the player's text of this turn), and the knowledge Retrieve attached this
turn: the `knowledge` section (one item per Retrieve: `name`, `query`, and `chunks`, each
with `id`, `text`, `distance`, `rank` and the record's `metadata`) and
`knowledge_<source>` (that source's item alone, so `{{#knowledge_lore}}` opens its chunks),
and `attribute_<name>` (the value ClassifyAttributesLLM resolved for an attribute this turn).

Nothing is HTML-escaped (these are prompts, not web pages); a missing key renders as
empty. Templates are parsed once when the node is compiled: a syntax error, an unclosed or
mismatched section, is 3003 at CreateAgent (3007 at ChangeAgentParam).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping

import langcodes
import pystache
from pystache.parser import ParsingError

_RENDERER = pystache.Renderer(escape=lambda text: text, missing_tags="ignore")


class TemplateError(ValueError):
    pass


class Template:
    __slots__ = ("source", "_parsed")

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._parsed = pystache.parse(source, raise_on_mismatch=True)
        except ParsingError as exc:
            raise TemplateError(f"Mustache syntax error: {exc}") from None

    def render(self, context: Mapping[str, Any]) -> str:
        return _RENDERER.render(self._parsed, context)

    def __bool__(self) -> bool:
        return bool(self.source)


def compile_template(source: str) -> Template | None:
    """None for an empty template."""
    return Template(source) if source else None


@functools.lru_cache(maxsize=64)
def locale_keys(locale: str) -> tuple[tuple[str, str], ...]:
    """locale / language_code / language for a (validated) BCP-47 tag."""
    if not locale:
        return (("locale", ""), ("language_code", ""), ("language", ""))
    lang = langcodes.Language.get(locale)
    code = lang.language or ""
    try:
        name = lang.language_name("en") if code else ""
    except LookupError:
        name = code
    return (("locale", locale), ("language_code", code), ("language", name))


def context(*, variables: Mapping[str, Any], instructions: list[tuple[str, str]],
            locale: str, user_message: str,
            knowledge: list[dict[str, Any]] = (),
            attributes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Mustache context of one render."""
    ctx: dict[str, Any] = dict(locale_keys(locale))
    ctx["var"] = variables
    ctx["user_message"] = user_message
    ctx["instructions"] = [{"name": n, "text": t} for n, t in instructions]
    for name, text in instructions:
        ctx[f"instruction_{name}"] = text
    for name, value in (attributes or {}).items():
        ctx[f"attribute_{name}"] = value
    ctx["knowledge"] = list(knowledge)
    for block in knowledge:
        ctx[f"knowledge_{block['name']}"] = block
    return ctx
