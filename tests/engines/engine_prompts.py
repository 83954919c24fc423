"""Prompt helpers shared by the engine tests."""


def chatml(user: str, system: str | None = "You are a helpful assistant.") -> str:
    """SmolLM2's ChatML prompt, written by hand (the chat-template module is tested elsewhere)."""
    out = ""
    if system is not None:
        out += f"<|im_start|>system\n{system}<|im_end|>\n"
    return out + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
