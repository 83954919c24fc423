"""ToolCall: detects whether the model wants to call one of `tools` (docs/workflow.md).

The tools go into the prompt the way the model's chat template expects (its `tools`
variable, or a block in the system message when the template has no tool support; either
way inside the shared prefix). Generation is grammar-constrained: RequireCall from the first
token, CallOrAnswer and DetectOnly lazily, from the call marker on (prose is free). The
output is parsed into calls or a classified failure (prompting/tools.py).

Call ids are c%08x, counted per interaction (not per node run, unlike the original), so a
second pass through the same node in one turn never reuses an id.

What a detected call does, by disposition (the ToolCall reference, docs/workflow.md):
    disposition            event  pause  history
    RouteOnly              no     no     omitted
    Acknowledge (default)  no     no     synthetic result (acknowledge_text, empty = "ok")
    Notify                 yes    no     omitted
    NotifyAndAcknowledge   yes    no     synthetic result
    Pause                  yes    yes    omitted
    PauseAndAcknowledge    yes    yes    synthetic result
    AwaitResult            yes    yes    the client's tool_results (ResumeAgentRequest)
The event is NodeEvent "tool_call" {tool_name, arguments_json, call_id, disposition}, one
per call, before the turn goes on. Every call is recorded in the interaction either way
(state detected / notified / resolved); "omitted" means it is not projected into prompts.
No call: exit no_tool_called; under CallOrAnswer the text is the answer (one Whole chunk
once the output is known not to be a call, and the reply in the dialog); DetectOnly and
RequireCall drop it. A call is recognised in the model's native form (the marker), as
plain JSON opening the reply or in a fenced block; a call attempt that does not parse is
never the answer: only the prose before it is (prompting/tools.py).
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.prompting.tools import (
    GENERIC, CallIds, ToolSet, mode_name, normalize_tools, split_reasoning,
)
from tryll_fast.workflow.dialog import Component
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow.nodes.generate import check_slot
from tryll_fast.workflow.nodes.llm import compile_llm

Disp = codec.ToolCallDisposition
DEFAULT_CONTEXT = 2048          # the ToolCall reference: 0 means 2048, never the model's window
DEFAULT_MAX_TOKENS = 758        # the ToolCall reference: when the model sets none

DISPOSITION_NAMES = {
    Disp.RouteOnly: "route_only", Disp.Acknowledge: "acknowledge", Disp.Notify: "notify",
    Disp.NotifyAndAcknowledge: "notify_and_acknowledge", Disp.Pause: "pause",
    Disp.PauseAndAcknowledge: "pause_and_acknowledge", Disp.AwaitResult: "await_result",
}
NOTIFIES = {Disp.Notify, Disp.NotifyAndAcknowledge, Disp.Pause, Disp.PauseAndAcknowledge,
            Disp.AwaitResult}
ACKNOWLEDGES = {Disp.Acknowledge, Disp.NotifyAndAcknowledge, Disp.PauseAndAcknowledge}
PAUSES = {Disp.Pause, Disp.PauseAndAcknowledge, Disp.AwaitResult}


def _toolset(x: dict, formatter, tool_prompt: str = "template") -> ToolSet:
    """The node's tools rendered for one model's chat format (built once per formatter):
    through the template's tools section, or with tool_prompt "own" always in the
    server's block (workflow.tool_prompt)."""
    key = (id(formatter), tool_prompt)
    ts = x["toolsets"].get(key)
    if ts is None:
        fmt = GENERIC if tool_prompt == "own" else None
        ts = x["toolsets"][key] = ToolSet(
            x["specs"], formatter=formatter, fmt=fmt, parallel_tool_calls=x["parallel"])
    return ts


class ToolCallNode(NodeType):
    kind = "ToolCall"
    params_cls = codec.ToolCallParams
    exits = ("tool_called", "no_tool_called")
    uses_model = True

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        if p.mode not in {int(m) for m in codec.ToolCallMode}:
            raise ctx.fail(where, f"mode {int(p.mode)} is not a ToolCallMode (0..2)")
        if p.disposition not in DISPOSITION_NAMES:
            raise ctx.fail(where, f"disposition {int(p.disposition)} is not a "
                                  "ToolCallDisposition (0..6)")
        if p.pause_timeout_ms < 0:
            raise ctx.fail(where, f"pause_timeout_ms {p.pause_timeout_ms} is negative "
                                  "(0 = the server's workflow.tool_call_pause_timeout_ms)")
        try:
            specs = normalize_tools(p.tools)
        except ValueError as exc:
            raise ctx.fail(where, f"tools: {exc}") from None
        if not specs:
            raise ctx.fail(where, "tools: a ToolCall node needs at least one tool definition")
        spec = compile_llm(name, p.model_name, p.context_size, p.sampling, ctx,
                           default_context=DEFAULT_CONTEXT,
                           default_max_tokens=DEFAULT_MAX_TOKENS, node_params=p)
        spec.extra.update(input=check_slot(name, p.input, ctx), specs=specs, toolsets={},
                          mode=mode_name(int(p.mode)), disposition=Disp(int(p.disposition)),
                          acknowledge=p.acknowledge_text or "ok",
                          parallel=bool(p.parallel_tool_calls))
        return spec

    def model_names(self, node: Node, default_model: str) -> tuple[str, ...]:
        return (node.spec.model,)

    def prefix_args(self, agent, node: Node, formatter) -> dict:
        x = node.spec.extra
        return dict(system_prompt=node.params.system_prompt, input_slot=x["input"],
                    tools=_toolset(x, formatter, agent.runtime.limits.tool_prompt),
                    tool_mode=x["mode"])

    async def run(self, turn, node: Node) -> str:
        p = node.params
        spec = node.spec
        x = spec.extra
        mode, disposition = x["mode"], x["disposition"]

        def toolset(formatter) -> ToolSet:
            return _toolset(x, formatter, turn.agent.runtime.limits.tool_prompt)

        # no character frame here: it cost the small models tool-call accuracy
        # (prompting/character.py)
        handle, ts = await turn.run_model(node, spec, system_prompt=p.system_prompt,
                                          input_slot=x["input"], tools=toolset,
                                          tool_mode=mode, grammar=lambda t: t.grammar(mode))
        inter = turn.interaction
        reasoning, reply = split_reasoning(handle.text)
        result = ts.parse(reply, CallIds(start=inter.calls_made))
        inter.calls_made += len(result.calls)
        dname = DISPOSITION_NAMES[disposition]
        output = result.diagnostics()
        if reasoning:
            output["reasoning_content"] = reasoning
        turn.note(node, parameters=_parameters(x, ts, p, spec), output=output,
                  grammar={"lazy": mode != "require_call", "format": ts.format.name})
        if not result.calls:
            # a call the parser could not read is not an answer: only the prose before it
            # reaches the player (ToolParseResult.prose)
            answer = result.prose if result.prose is not None else result.text
            if mode == "call_or_answer" and answer:
                turn.send_whole(node.name, answer)
                turn.add_reply(node, answer)
            return "no_tool_called"
        projected = disposition in ACKNOWLEDGES or disposition == Disp.AwaitResult
        awaiting = []
        for call in result.calls:
            comp = inter.add(Component(
                kind="tool_call", slot=node.name, node_name=node.name,
                text=call.arguments_json, name=call.name,
                extra={"call_id": call.id, "disposition": dname, "state": "detected",
                       "projected": projected, "model_call_id": call.model_id or ""}))
            if disposition in NOTIFIES:
                turn.send_event(node.name, "tool_call", {
                    "tool_name": call.name, "arguments_json": call.arguments_json,
                    "call_id": call.id, "disposition": dname})
                comp.extra["state"] = "notified"
            if disposition in ACKNOWLEDGES:
                inter.add(Component(
                    kind="tool_result", slot=node.name, node_name=node.name,
                    text=x["acknowledge"], name=call.name, role="tool",
                    producer="server_synthetic",
                    extra={"call_id": call.id, "projected": True}))
                comp.extra["state"] = "resolved"
            elif disposition == Disp.AwaitResult:
                awaiting.append(comp)
        if disposition in PAUSES:
            timeout = p.pause_timeout_ms or turn.agent.runtime.limits.tool_call_pause_timeout_ms
            turn.request_pause("tool_call", timeout, await_calls=tuple(awaiting))
        return "tool_called"


def _parameters(x: dict, ts: ToolSet, p, spec) -> dict:
    """The `parameters.*` keys of the ToolCall reference's diagnostics."""
    from tryll_fast.prompting.tools import tool_signature_lines
    out = {"model_name": spec.model, "tool_count": len(x["specs"]),
           "tools": tool_signature_lines(x["specs"]), "mode": x["mode"],
           "parallel_tool_calls": x["parallel"],
           "disposition": DISPOSITION_NAMES[x["disposition"]]}
    if p.acknowledge_text:
        out["acknowledge_text"] = p.acknowledge_text
    if p.input:
        out["input"] = p.input
    out.update({k: v for k, v in spec.sampling.items()})
    return out
