"""The orchestrator: one asyncio event loop on its own thread runs every turn.

A turn is a coroutine (turn.py). Nodes that only touch memory run inline; a language-model
node submits to its engine and awaits the request's on_finish, which the scheduler thread
hands back with call_soon_threadsafe. Tokens do not come here: they go from the scheduler
thread straight to the connection (AnswerStream). Blocking work a turn needs (loading a
model on first use) runs on the server's worker pool. Pause deadlines are timers on this
loop.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from dataclasses import dataclass
from typing import Coroutine

log = logging.getLogger("tryll_fast.workflow")


@dataclass(frozen=True)
class Limits:
    # what every character-speaking node's system message opens with (workflow.character_frame)
    character_frame: str = ""
    # how ToolCall nodes describe their tools: "template" (the chat template's own tools
    # section, where it has one) or "own" (our block in the system message, same marker)
    tool_prompt: str = "template"
    max_steps_per_turn: int = 64
    max_agents_per_session: int = 256
    regex_timeout_s: float = 0.05
    tool_call_pause_timeout_ms: int = 0     # 0 = a ToolCall pause waits forever
    turn_timeout_ms: int = 0                # 0 = a turn has no time limit
    include_engine_diagnostics: bool = True          # each model node's `engine` block
    include_interaction_in_diagnostics: bool = False  # the turn's `interaction` snapshot
    kv_evict_tier: str = "file"   # Evict: to a file or a host copy (fast restore), or free
    voice_chunk_ms: int = 40      # audio per TtsAudioFrame


class Runtime:
    def __init__(self, models, workers: concurrent.futures.Executor, limits: Limits) -> None:
        self.models = models
        self.workers = workers
        self.limits = limits
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tryll-orchestrator",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def spawn(self, coro: Coroutine) -> concurrent.futures.Future:
        """Run a coroutine on the orchestrator (any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    @staticmethod
    def formatter(engine):
        """The chat formatter of a language model (engines/roles.py; built once per engine)."""
        return engine.chat_formatter()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
