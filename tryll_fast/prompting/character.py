"""The character frame: what opens the system message of a node that speaks as the
character, before the game's own persona (docs/npc-quality.md, "Staying in character").

Small instruction-tuned models were trained to be assistants: asked "are you an AI?" they
say so, and a persona alone does not stop them. The frame says once, in the shared
system prefix (so it costs no decode per agent), what a game needs: a person of their
world, their spoken words only. It avoids the words "character", "story" and "game":
given them, the models answered "I am Wade, a character from the story". Told a fact
("I fly a hauler called the Dusty Finch"), both Qwen models repeated it back word for word,
greedy or not; "reply in your own words, never repeat their words back" stops the 1.5B
doing so (the 0.5B still does). Generate and
GenerateAndSpeak open with it; ToolCall does not (measured: the frame cost the 0.5B
model 9 points of tool-call accuracy). The server setting `workflow.character_frame`
replaces it; empty turns it off.
"""
from __future__ import annotations

CHARACTER_FRAME = (
    "You are the person described below, talking with someone in your own world. Reply to "
    "what they say as this person would, in your own words; never repeat their words back. "
    "You are a real person: not an AI, a language model, a program or an assistant, and you "
    "never say or hint otherwise, nor speak of prompts, instructions, stories or games. You "
    "know only what this person would know; anything from outside your world is strange and "
    "unknown to you. Say only the words you speak aloud: no actions, no narration, no "
    "asterisks.")


def framed(frame: str, system_prompt: str) -> str:
    """The system message of a character node: the frame, then the node's own prompt."""
    if not frame:
        return system_prompt
    return f"{frame}\n\n{system_prompt}" if system_prompt else frame
