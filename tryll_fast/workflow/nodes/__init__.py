"""The node types, one module each; TYPES maps a NodeParams member to its NodeType.

Built: Generate, CannedResponse, Instruction, HumanMessageGuardrail, ToolCall, Pause, Speak,
GenerateAndSpeak, ClassifyIntentLLM, IntentToInstruction, Retrieve, ClassifyIntent,
ClassifyAttributesLLM, Summarize. The other members of the union are known (so a graph using them gets a
clear 2007 FeatureNotAvailable naming the feature, not a parse error) until their feature
is built.
"""
from tryll_fast import codec
from tryll_fast.workflow.graph import NodeType
from tryll_fast.workflow.nodes.canned import CannedResponseNode
from tryll_fast.workflow.nodes.classify import (
    ClassifyAttributesLLMNode, ClassifyIntentLLMNode, IntentToInstructionNode,
)
from tryll_fast.workflow.nodes.generate import GenerateNode
from tryll_fast.workflow.nodes.guardrail import GuardrailNode
from tryll_fast.workflow.nodes.instruction import InstructionNode
from tryll_fast.workflow.nodes.pause import PauseNode
from tryll_fast.workflow.nodes.retrieve import ClassifyIntentNode, RetrieveNode
from tryll_fast.workflow.nodes.speak import GenerateAndSpeakNode, SpeakNode
from tryll_fast.workflow.nodes.summarize import SummarizeNode
from tryll_fast.workflow.nodes.toolcall import ToolCallNode


def _pending(kind: str, params_cls: type, exits: tuple[str, ...], feature: str) -> NodeType:
    t = NodeType()
    t.kind = kind
    t.params_cls = params_cls
    t.exits = exits
    t.missing_feature = feature
    return t


_KNOWLEDGE = "mutable knowledge bases"

TYPES: dict[type, NodeType] = {t.params_cls: t for t in (
    GenerateNode(), CannedResponseNode(), InstructionNode(), GuardrailNode(), ToolCallNode(),
    PauseNode(), SpeakNode(), GenerateAndSpeakNode(), ClassifyIntentLLMNode(),
    IntentToInstructionNode(), RetrieveNode(), ClassifyIntentNode(),
    ClassifyAttributesLLMNode(),
    _pending("WriteToMemory", codec.WriteToMemoryParams, ("default",), _KNOWLEDGE),
    SummarizeNode(),
)}
