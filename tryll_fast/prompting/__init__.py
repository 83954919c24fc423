"""Prompt building, engine-neutral: what a language-model node turns a dialog into.

Owns: chat templates (chat.py: a model's own Jinja template from its GGUF metadata,
rendered in a sandbox, with fallbacks for models without one, per-message spans and the
stable prefix shared between agents) and tool calls (tools.py: the tools' JSON schema and
prompt text, the GBNF grammar that keeps a call well-formed, and the parser that turns
output back into calls or a classified failure) and the character frame (character.py:
what opens a character node's system message). An engine supplies the metadata
(LanguageModel.chat_formatter); nothing here loads or runs a model.
"""
