"""Instruction: attaches {name, text} to the turn (docs/workflow.md). A later Generate
template reads it as `{{instruction_<name>}}` or in
`{{#instructions}}{{name}}: {{text}}{{/instructions}}`.
The text is Mustache, rendered when the node runs; the name defaults to the node's name.
It is kept in the interaction (hidden from later prompts) so an exported dialog has it.
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow.nodes.generate import compile_template_field


class InstructionNode(NodeType):
    kind = "Instruction"
    params_cls = codec.InstructionParams
    exits = ("default",)

    def compile(self, name: str, p, ctx: CompileContext):
        return (p.instruction_name or name,
                compile_template_field(name, "instruction", p.instruction, ctx))

    async def run(self, turn, node: Node) -> str:
        instruction_name, template = node.spec
        text = template.render(turn.template_context()) if template else ""
        turn.add_instruction(node, instruction_name, text)
        return "default"
