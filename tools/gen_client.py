"""Generate the client's request methods, written out, from the one description of them.

    python tools/gen_client.py            # write tryll_fast/client/_methods.py
    python tools/gen_client.py --check    # exit 1 if it is stale

`client.core.Calls` (session and model requests), `client.dialog.DialogCalls` (an
agent's dialog and KV-cache requests), `client.voice.VoiceCalls` (its voice) and
`client.voice_input.VoiceInputCalls` (a microphone's handle) describe each request once: its arguments, its
docstring and how to build and read it. This writes, for each, a blocking method and a
`<name>_async` returning a concurrent.futures.Future (TryllClient, Agent) and a coroutine
and a `<name>_async` returning an asyncio.Future (AsyncTryllClient, AsyncAgent), as plain
source a reader or an IDE can find, so the blocking and the asyncio client cannot drift.
"""
from __future__ import annotations

import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import checked_in  # noqa: E402

OUT = os.path.join(ROOT, "tryll_fast", "client", "_methods.py")


def _params(fn) -> tuple[list[str], str, bool]:
    """(the parameters after self, the call's argument list, whether it takes *args)."""
    sig = inspect.signature(fn)
    decl, call, star = [], [], False
    for p in list(sig.parameters.values())[1:]:
        ann = f": {p.annotation}" if p.annotation is not inspect.Parameter.empty else ""
        if p.kind is p.VAR_POSITIONAL:
            decl.append(f"*{p.name}{ann}")
            call.append(f"*{p.name}")
            star = True
            continue
        default = "" if p.default is inspect.Parameter.empty else f" = {p.default!r}"
        decl.append(f"{p.name}{ann}{default}")
        call.append(p.name)
    return decl, ", ".join(call), star


def _def(head: str, params: list[str], tail: str) -> list[str]:
    """`head(self, params...) tail`, one parameter a line when it would pass 100 columns."""
    one = f"{head}({', '.join(['self', *params])}){tail}"
    if len(one) <= 100:
        return [one]
    return [f"{head}(", *(f"            {p}," for p in ["self", *params]), f"    ){tail}"]


# The generated classes: name, docstring lines, the call table's name, the object that owns
# wait/start, and whether the methods are coroutines.
_CLASSES = (
    ("SyncMethods",
     ['"""TryllClient\'s request methods (each blocks for its reply)."""'],
     "Calls", "self", False),
    ("AsyncMethods",
     ['"""AsyncTryllClient\'s request methods (each is awaited)."""'],
     "Calls", "self", True),
    ("AgentDialogMethods",
     ['"""Agent\'s dialog and KV-cache requests (each blocks for its reply; 3004 while',
      'the agent\'s turn runs or is paused)."""'],
     "DialogCalls", "self.client", False),
    ("AsyncAgentDialogMethods",
     ['"""AsyncAgent\'s dialog and KV-cache requests (each is awaited)."""'],
     "DialogCalls", "self.client", True),
    ("AgentVoiceMethods",
     ['"""Agent\'s voice requests (each blocks for its reply)."""'],
     "VoiceCalls", "self.client", False),
    ("AsyncAgentVoiceMethods",
     ['"""AsyncAgent\'s voice requests (each is awaited)."""'],
     "VoiceCalls", "self.client", True),
    ("VoiceInputMethods",
     ['"""A voice input handle\'s requests (each blocks for its Ack)."""'],
     "VoiceInputCalls", "self.client", False),
    ("AsyncVoiceInputMethods",
     ['"""An asyncio voice input handle\'s requests (each is awaited)."""'],
     "VoiceInputCalls", "self.client", True),
    ("MutableKbMethods",
     ['"""A mutable knowledge base handle\'s requests (each blocks for its reply)."""'],
     "MutableKbCalls", "self.client", False),
    ("AsyncMutableKbMethods",
     ['"""An asyncio mutable knowledge base handle\'s requests (each is awaited)."""'],
     "MutableKbCalls", "self.client", True),
)


def _methods(owner: str, cls, wait: str, start: str, asyncio: bool) -> list[str]:
    out = []
    for name in [n for n in vars(cls) if not n.startswith("_")]:
        fn = getattr(cls, name)
        decl, call, star = _params(fn)
        doc = inspect.getdoc(fn) or name.replace("_", " ")
        call_expr = f"{owner}.{name}(self{', ' if call else ''}{call})"
        kw = "async def" if asyncio else "def"
        aw = "await " if asyncio else ""
        fut = "asyncio.Future" if asyncio else "concurrent.futures.Future"
        lines = doc.splitlines()
        timed = decl + ([] if star else ["*"]) + ["timeout: float | None = None"]
        out.extend(_def(f"    {kw} {name}", timed, " -> Any:"))
        out.append(f'        """{lines[0]}')
        out.extend(f"        {line}".rstrip() for line in lines[1:])
        out.append("")
        out.append("        `timeout`: seconds to wait for the reply (None: the client's).")
        out.append('        """')
        out.append(f"        call = {call_expr}")
        out.append(f"        return {aw}{wait}(call, timeout)")
        out.append("")
        out.extend(_def(f"    def {name}_async", decl, f" -> {fut}:"))
        out.append(f'        """{name}() without waiting for the reply: a future of it."""')
        out.append(f"        return {start}({call_expr})")
        out.append("")
    return out


def render() -> str:
    from tryll_fast.client.core import Calls
    from tryll_fast.client.dialog import DialogCalls
    from tryll_fast.client.voice import VoiceCalls
    from tryll_fast.client.voice_input import VoiceInputCalls
    from tryll_fast.client.memory import MutableKbCalls
    out = ['"""GENERATED by tools/gen_client.py from client.core.Calls,',
           'client.dialog.DialogCalls, client.voice.VoiceCalls,',
           'client.voice_input.VoiceInputCalls and client.memory.MutableKbCalls',
           '-- do not edit."""',
           "from __future__ import annotations", "",
           "import asyncio", "import concurrent.futures",
           "from typing import Any, Callable, Iterable, Mapping", "",
           "from tryll_fast.client.core import Calls",
           "from tryll_fast.client.dialog import DialogCalls",
           "from tryll_fast.client.voice import VoiceCalls",
           "from tryll_fast.client.voice_input import VoiceInputCalls",
           "from tryll_fast.client.memory import MutableKbCalls", "", ""]
    tables = {"Calls": Calls, "DialogCalls": DialogCalls, "VoiceCalls": VoiceCalls,
              "VoiceInputCalls": VoiceInputCalls, "MutableKbCalls": MutableKbCalls}
    for name, doc, calls, via, asynchronous in _CLASSES:
        out += [f"class {name}:", *(f"    {line}" for line in doc), ""]
        out += _methods(calls, tables[calls], f"{via}.wait", f"{via}.start", asynchronous)
        out.append("")
    while out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    return checked_in.run(__doc__.splitlines()[0], lambda: [(OUT, render())], argv)


if __name__ == "__main__":
    sys.exit(main())
