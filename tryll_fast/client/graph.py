"""The graph vocabulary in one import, under the names the official Tryll clients use:

    from tryll_fast.client.graph import (
        GraphDescription, ToolCallParams, GenerateParams, ToolDefinition, ToolParamDefinition)

GraphDescription is the client's builder (add_node, set_start_node,
set_default_model_name); everything else is the codec's node params tables, their
support tables and their enums, exactly as schema/nodes.fbs declares them. A long chat
that keeps its start as a running summary (docs/workflow.md, "Summarize"):

    graph = (GraphDescription()
             .add_node("answer", GenerateParams(system_prompt="You are Brenna.",
                                                default_exit="remember"))
             .add_node("remember", SummarizeParams(keep_recent_turns=4, trigger_turns=8))
             .set_start_node("answer"))
    agent.set_on_summary_started(lambda node, interactions, folding, trigger: ...)
"""
from tryll_fast.client.agents import GraphDescription
from tryll_fast.codec import (
    AttributeDefinition, CannedResponseParams, CannedResponseSelectionStrategy,
    ClassifyAttributesLLMParams, ClassifyIntentLLMParams, ClassifyIntentParams,
    ContextOverrides, FlashAttention, GenerateAndSpeakParams, GenerateParams,
    HumanMessageGuardrailParams, InstructionParams, IntentToInstructionParams, KvCacheType,
    LocalizableText, LoraAdapter, MemoryContent, ModelAdaptation, NodeParams, NotifyClient,
    PauseParams, Placement, RetrievalMode, RetrieveParams, SamplingOverrides, SendMode,
    SpeakParams, SummarizeParams, ToolCallDisposition, ToolCallMode, ToolCallParams,
    ToolDefinition, ToolParamDefinition, WriteToMemoryParams,
)

__all__ = [
    "AttributeDefinition", "CannedResponseParams", "CannedResponseSelectionStrategy",
    "ClassifyAttributesLLMParams", "ClassifyIntentLLMParams", "ClassifyIntentParams",
    "ContextOverrides", "FlashAttention", "GenerateAndSpeakParams", "GenerateParams",
    "GraphDescription", "HumanMessageGuardrailParams", "InstructionParams",
    "IntentToInstructionParams", "KvCacheType", "LocalizableText", "LoraAdapter",
    "MemoryContent", "ModelAdaptation", "NodeParams", "NotifyClient", "PauseParams",
    "Placement", "RetrievalMode", "RetrieveParams", "SamplingOverrides", "SendMode",
    "SpeakParams", "SummarizeParams", "ToolCallDisposition", "ToolCallMode", "ToolCallParams",
    "ToolDefinition", "ToolParamDefinition", "WriteToMemoryParams",
]
