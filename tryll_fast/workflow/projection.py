"""Projection: the dialog seen by one language-model node of one agent, as prompt tokens.

Messages, in order: the system prompt (pinned), then each interaction in the window (its
user message, then its replies joined into one assistant message), then this turn: the
rendered template where `placement` puts it, the input (the player's message or another
node's output), and replies earlier nodes gave in this turn. The model's own chat template
renders them (engines/llama/chat.py); the text is tokenized with special tokens parsed.

Token budget with hysteresis (SPEC §5): high = context size - max_tokens. When a prompt is
over `high`, the oldest interactions leave the window until it is at most 75 % of `high`.
The window only moves forward (until the dialog is edited), so between drops every turn's
prompt starts with the previous turn's and the engine decodes only the new suffix.

Shared prefix: the rendered system part (StablePrefix) is identical for every agent with the
same system prompt; its token count is passed as shared_prefix_len, so the engine decodes
it once and shares its KV cells between those agents.
"""
from __future__ import annotations

from dataclasses import dataclass

from tryll_fast import codec
from tryll_fast.workflow.dialog import Dialog, Interaction

KEEP_FRACTION = 0.75
Placement = codec.PromptPlacement


class ProjectionError(ValueError):
    pass


@dataclass
class Prompt:
    tokens: list[int]
    shared_prefix_len: int
    text: str
    window: int               # interactions of history included
    dropped: int              # interactions that left the window in this build


class Projection:
    """Per agent x node; rebuilt from scratch when the dialog was edited."""

    def __init__(self, engine, formatter) -> None:
        self.engine = engine
        self.formatter = formatter
        self.window_start = 0           # id of the oldest interaction still projected
        self.dialog_version = -1
        self._prefix_key: str | None = None
        self._prefix_tokens: list[int] = []

    def invalidate(self) -> None:
        self.window_start = 0
        self.dialog_version = -1

    def _tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text, add_special=self.formatter.add_bos,
                                    parse_special=True)

    def build(self, dialog: Dialog, current: Interaction, *, system_prompt: str,
              template_text: str, placement: int, input_text: str, n_ctx: int,
              reserve: int) -> Prompt:
        if dialog.version != self.dialog_version:
            self.window_start = 0
            self.dialog_version = dialog.version
        system = system_prompt
        if placement == Placement.SystemPromptEnd and template_text:
            system = f"{system}\n\n{template_text}" if system else template_text
        head = [{"role": "system", "content": system}] if system else []
        tail = []
        if placement == Placement.SystemBeforeUser and template_text:
            tail.append({"role": "system", "content": template_text})
        user = input_text
        if placement == Placement.UserMessage and template_text:
            user = f"{template_text}\n\n{input_text}" if input_text else template_text
        tail.append({"role": "user", "content": user})
        earlier = current.assistant_text()
        if earlier:
            tail.append({"role": "assistant", "content": earlier})
        history = [i for i in dialog.interactions
                   if i is not current and i.id >= self.window_start and i.outcome != "running"]

        def render(start: int) -> tuple[str, list[int]]:
            msgs = list(head)
            for inter in history[start:]:
                u, a = inter.user_text, inter.assistant_text()
                if u:
                    msgs.append({"role": "user", "content": u})
                if a:
                    msgs.append({"role": "assistant", "content": a})
            text = self.formatter.render(msgs + tail, add_generation_prompt=True)
            return text, self._tokenize(text)

        high = n_ctx - reserve
        text, tokens = render(0)
        dropped = 0
        if len(tokens) > high:
            target = int(high * KEEP_FRACTION)
            lo, hi = 1, len(history)           # smallest start that fits the target
            best = None
            while lo <= hi:
                mid = (lo + hi) // 2
                t, toks = render(mid)
                if len(toks) <= target:
                    best, hi = (mid, t, toks), mid - 1
                else:
                    lo = mid + 1
            if best is None:
                t, toks = render(len(history))
                if len(toks) > high:
                    raise ProjectionError(
                        f"the prompt needs {len(toks)} tokens without any history, more than "
                        f"the {high} the node has (context size {n_ctx} minus max_tokens "
                        f"{reserve})")
                best = (len(history), t, toks)
            dropped, text, tokens = best
            if dropped < len(history):
                self.window_start = history[dropped].id
            else:
                self.window_start = current.id
        return Prompt(tokens=tokens, shared_prefix_len=self._shared_len(head, tokens),
                      text=text, window=len(history) - dropped, dropped=dropped)

    def _shared_len(self, head: list[dict], tokens: list[int]) -> int:
        if not head:
            return 0
        key = head[0]["content"]
        if key != self._prefix_key:
            prefix = self.formatter.stable_prefix(head + [{"role": "user", "content": "x"}])
            self._prefix_tokens = self._tokenize(prefix.text) if prefix.text else []
            self._prefix_key = key
        n = len(self._prefix_tokens)
        # The prefix is cut at a newline, so its tokens are the prompt's first tokens; if a
        # tokenizer ever merged across that boundary, share nothing rather than wrong cells.
        return n if n and tokens[:n] == self._prefix_tokens else 0
