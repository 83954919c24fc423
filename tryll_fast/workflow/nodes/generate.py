"""Generate: the language model on the projected dialog; appends the reply (docs/workflow.md).

- model_name empty = the agent's default; context_size 0 = the model's window;
- system_prompt pinned first, after the server's character frame (prompting/character.py);
  `template` (Mustache) rendered each run and placed by
  `placement` (in place of the user message, a user or system message before or after it,
  or the system prompt's end: docs/workflow.md);
- `input` names the slot projected as the user turn (empty = the player's message, else a
  node that ran earlier in this turn);
- send Streamed: AnswerText deltas as tokens arrive, then the empty terminator; Whole: one
  chunk with the whole reply; None: nothing (the reply is still appended to the dialog).
- `context` (ContextOverrides) and `adaptation` (LoRA adapters) choose the context the
  node runs on (nodes/llm.py compile_lane; docs/workflow.md).
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.prompting.character import framed
from tryll_fast.workflow.dialog import USER_SLOT
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow import templates
from tryll_fast.workflow.nodes.llm import compile_llm
from tryll_fast.workflow.templates import TemplateError, compile_template

_SEND = {int(m) for m in codec.SendMode}
_PLACEMENT = {int(m) for m in codec.Placement}


def check_slot(name: str, slot: str, ctx: CompileContext) -> str:
    slot = slot or USER_SLOT
    if slot != USER_SLOT and slot not in ctx.node_names:
        raise ctx.fail(f"node {name!r}", f"input {slot!r} is neither {USER_SLOT!r} nor a node "
                                         "of the graph")
    return slot


def compile_template_field(name: str, field: str, source: str, ctx: CompileContext):
    try:
        return compile_template(source)
    except TemplateError as exc:
        raise ctx.fail(f"node {name!r}", f"{field}: {exc}") from None


class GenerateNode(NodeType):
    kind = "Generate"
    params_cls = codec.GenerateParams
    exits = ("default",)
    uses_model = True

    def compile(self, name: str, p, ctx: CompileContext):
        if p.send not in _SEND:
            raise ctx.fail(f"node {name!r}", f"send {int(p.send)} is not a SendMode (0..2)")
        if p.placement not in _PLACEMENT:
            raise ctx.fail(f"node {name!r}",
                           f"placement {int(p.placement)} is not a Placement (0..5)")
        spec = compile_llm(name, p.model_name, p.context_size, p.sampling, ctx, node_params=p,
                           speech=True)
        spec.extra["template"] = compile_template_field(name, "template", p.template, ctx)
        spec.extra["input"] = check_slot(name, p.input, ctx)
        return spec

    def model_names(self, node: Node, default_model: str) -> tuple[str, ...]:
        return (node.spec.model,)

    def prefix_args(self, agent, node: Node, formatter) -> dict:
        p = node.params
        template = node.spec.extra["template"]
        rendered = ""
        if template and p.placement == codec.Placement.SystemPromptEnd:
            # Only this placement puts the template before the turn's input; it renders
            # with the variables as they are now (a later change re-syncs the prompt).
            rendered = template.render(templates.context(
                variables=agent.variables.template_view(), instructions=[],
                locale=agent.session.locale, user_message=""))
        return dict(system_prompt=framed(agent.runtime.limits.character_frame,
                                         p.system_prompt),
                    template_text=rendered, placement=int(p.placement),
                    input_slot=node.spec.extra["input"])

    async def run(self, turn, node: Node) -> str:
        p = node.params
        spec = node.spec
        template = spec.extra["template"]
        rendered = template.render(turn.template_context()) if template else ""
        text, _cut = await turn.generate(node, spec, system_prompt=turn.character(p),
                                         template_text=rendered, placement=int(p.placement),
                                         input_slot=spec.extra["input"], send=int(p.send))
        turn.add_reply(node, text)
        return "default"
