"""The node types, one module each; TYPES maps a NodeParams member to its NodeType.

Built: Generate, CannedResponse, Instruction, HumanMessageGuardrail, ToolCall, Pause, Speak,
GenerateAndSpeak, ClassifyIntentLLM, IntentToInstruction, Retrieve, ClassifyIntent,
ClassifyAttributesLLM, WriteToMemory, Summarize: every member of the NodeParams union.
LoRA adaptation and per-node context overrides choose the context a language-model node
runs on (nodes/llm.py compile_lane).
"""
from tryll_fast.workflow.graph import NodeType
from tryll_fast.workflow.nodes.canned import CannedResponseNode
from tryll_fast.workflow.nodes.classify import (
    ClassifyAttributesLLMNode, ClassifyIntentLLMNode, IntentToInstructionNode,
)
from tryll_fast.workflow.nodes.generate import GenerateNode
from tryll_fast.workflow.nodes.guardrail import GuardrailNode
from tryll_fast.workflow.nodes.instruction import InstructionNode
from tryll_fast.workflow.nodes.memory import WriteToMemoryNode
from tryll_fast.workflow.nodes.pause import PauseNode
from tryll_fast.workflow.nodes.retrieve import ClassifyIntentNode, RetrieveNode
from tryll_fast.workflow.nodes.speak import GenerateAndSpeakNode, SpeakNode
from tryll_fast.workflow.nodes.summarize import SummarizeNode
from tryll_fast.workflow.nodes.toolcall import ToolCallNode


TYPES: dict[type, NodeType] = {t.params_cls: t for t in (
    GenerateNode(), CannedResponseNode(), InstructionNode(), GuardrailNode(), ToolCallNode(),
    PauseNode(), SpeakNode(), GenerateAndSpeakNode(), ClassifyIntentLLMNode(),
    IntentToInstructionNode(), RetrieveNode(), ClassifyIntentNode(),
    ClassifyAttributesLLMNode(), WriteToMemoryNode(), SummarizeNode(),
)}
