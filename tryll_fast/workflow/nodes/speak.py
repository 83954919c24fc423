"""Speak and GenerateAndSpeak: the nodes that give an agent its voice (docs/voice.md).

- Speak voices the latest non-empty assistant text of this turn (a CannedResponse's line, a
  Generate's reply) with the agent's VoiceProfile, no language model; with none it exits
  silently. It sends no AnswerText.
- GenerateAndSpeak is Generate (same model, prompt, template, placement, sampling and
  `send` rules) whose reply is also cut into sentences as it streams
  (workflow/sentences.py): each finished sentence goes to the voice while the model is
  still writing the next, so the first sentence plays long before the reply is complete.
Both wait until their audio is sent before taking their exit. min_sentence_chars (>= 1) and
first_chunk_max_chars (>= 0, 0 = no cap) are their mutable settings.
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow.nodes.generate import GenerateNode
from tryll_fast.workflow.sentences import SentenceSplitter, speakable


def check_speech_params(name: str, p, ctx: CompileContext) -> None:
    if p.min_sentence_chars < 1:
        raise ctx.fail(f"node {name!r}", f"min_sentence_chars {p.min_sentence_chars} must be "
                                         ">= 1")
    if p.first_chunk_max_chars < 0:
        raise ctx.fail(f"node {name!r}", f"first_chunk_max_chars {p.first_chunk_max_chars} "
                                         "must be >= 0 (0 = no cap)")


def splitter_for(p) -> SentenceSplitter:
    return SentenceSplitter(p.min_sentence_chars, p.first_chunk_max_chars)


class SpeakNode(NodeType):
    kind = "Speak"
    params_cls = codec.SpeakParams
    exits = ("default",)
    speaks = True

    def compile(self, name: str, p, ctx: CompileContext):
        check_speech_params(name, p, ctx)
        return None

    async def run(self, turn, node: Node) -> str:
        text = turn.latest_reply()
        if not text:
            turn.note(node, spoken=False, reason="no assistant text in this turn")
            return "default"
        splitter = splitter_for(node.params)
        strand = await turn.open_strand(node)
        for sentence in splitter.feed(text) + splitter.flush():
            strand.add(speakable(sentence))
        strand.close()
        await turn.finish_strand(node, strand)
        return "default"


class GenerateAndSpeakNode(GenerateNode):
    kind = "GenerateAndSpeak"
    params_cls = codec.GenerateAndSpeakParams
    speaks = True

    def compile(self, name: str, p, ctx: CompileContext):
        check_speech_params(name, p, ctx)
        return super().compile(name, p, ctx)

    async def run(self, turn, node: Node) -> str:
        p = node.params
        spec = node.spec
        template = spec.extra["template"]
        rendered = template.render(turn.template_context()) if template else ""
        splitter = splitter_for(p)
        strand = await turn.open_strand(node)

        def on_text(chunk: str) -> None:        # the language model's thread
            for sentence in splitter.feed(chunk):
                strand.add(speakable(sentence))

        try:
            text, cut = await turn.generate(node, spec, system_prompt=turn.character(p),
                                            template_text=rendered,
                                            placement=int(p.placement),
                                            input_slot=spec.extra["input"],
                                            send=int(p.send), on_text=on_text,
                                            visible=False)     # spoken: Buffered
        except BaseException:
            strand.cancel()
            raise
        # a reply the token budget cut off is not spoken past its last full sentence
        for sentence in splitter.flush(complete_only=cut):
            strand.add(speakable(sentence))
        strand.close()
        turn.add_reply(node, text)
        await turn.finish_strand(node, strand)
        return "default"
