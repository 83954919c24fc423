"""Chat templates: the model's own Jinja template, the fallback table, token spans."""

import pytest

from tryll_fast.prompting.chat import (
    ChatFormatter, ChatTemplateError, read_gguf_metadata,
)

SMOL = "SmolLM2-135M-Instruct"
GEMMA = "Gemma-3-270M"
MODEL_FIXTURE = {"smol": "smollm2", "gemma": "gemma"}   # tests/engines/conftest.py


def _vocab_tokenizer(path):
    """tokenize(text) with the model's own vocabulary (vocab_only: no weights)."""
    from llama_cpp import Llama
    llm = Llama(str(path), vocab_only=True, verbose=False)
    add_bos = bool(llm._model.add_bos_token()) if hasattr(llm._model, "add_bos_token") else True

    def tokenize(text):
        return llm.tokenize(text.encode(), add_bos=add_bos, special=True)
    tokenize.llm = llm
    return tokenize


@pytest.fixture(scope="module")
def smol_tok(smollm2):
    return _vocab_tokenizer(smollm2)


@pytest.fixture(scope="module")
def gemma_tok(gemma):
    return _vocab_tokenizer(gemma)


CONVERSATION = [
    {"role": "system", "content": "You are Bob, a blacksmith."},
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Welcome to my forge."},
    {"role": "user", "content": "Can you fix my sword?"},
]

CHATML_EXPECTED = (
    "<|im_start|>system\nYou are Bob, a blacksmith.<|im_end|>\n"
    "<|im_start|>user\nHi there!<|im_end|>\n"
    "<|im_start|>assistant\nWelcome to my forge.<|im_end|>\n"
    "<|im_start|>user\nCan you fix my sword?<|im_end|>\n"
    "<|im_start|>assistant\n"
)

GEMMA_EXPECTED = (
    "<start_of_turn>user\nYou are Bob, a blacksmith.\n\nHi there!<end_of_turn>\n"
    "<start_of_turn>model\nWelcome to my forge.<end_of_turn>\n"
    "<start_of_turn>user\nCan you fix my sword?<end_of_turn>\n"
    "<start_of_turn>model\n"
)


# ---------------------------------------------------------------- model's own template

@pytest.mark.model
def test_smollm2_template_renders_chatml_exactly(smollm2):
    f = ChatFormatter.from_gguf(smollm2)
    assert f.source == "gguf"
    assert f.render(CONVERSATION) == CHATML_EXPECTED
    assert f.render(CONVERSATION, add_generation_prompt=False) == \
        CHATML_EXPECTED[:-len("<|im_start|>assistant\n")]
    assert "<|im_end|>" in f.stop_strings
    assert not f.supports_tools


@pytest.mark.model
def test_smollm2_default_system_prompt_is_charged_to_first_message(smollm2):
    f = ChatFormatter.from_gguf(smollm2)
    text = f.render([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    spans = f.message_spans([{"role": "user", "content": "Hi"}])
    assert spans[0].start == 0 and text[:spans[0].end].endswith("Hi<|im_end|>\n")


@pytest.mark.model
def test_a_loaded_model_gives_the_same_template(smollm2, smollm2_model):
    a = ChatFormatter.from_gguf(smollm2)
    b = ChatFormatter.from_metadata(smollm2_model.chat_metadata())
    assert a.template_source == b.template_source
    assert b.render(CONVERSATION) == CHATML_EXPECTED


@pytest.mark.model
def test_gguf_header_reader_resolves_special_tokens(smollm2):
    meta = read_gguf_metadata(smollm2)
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.eos_token"] == "<|im_end|>"
    assert meta["tokenizer.ggml.tokens"][0] == "array"


# ---------------------------------------------------------------- fallback table

@pytest.mark.model
def test_gemma_base_model_uses_the_turn_format_fallback(gemma):
    f = ChatFormatter.from_gguf(gemma)
    assert f.source == "fallback:gemma-turns"
    assert "loosely" in f.note
    assert f.add_bos  # the tokenizer adds <bos>, so the text must not carry it
    assert f.render(CONVERSATION) == GEMMA_EXPECTED
    assert f.stop_strings[0] == "<end_of_turn>"


def test_gemma_fallback_from_metadata_without_system():
    f = ChatFormatter.from_metadata({"general.architecture": "gemma3",
                                     "general.name": "Gemma 3 270m",
                                     "tokenizer.ggml.bos_token": "<bos>"})
    text = f.render([{"role": "user", "content": "Hello"}])
    assert text == "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"


def test_unknown_model_without_template_raises():
    with pytest.raises(ChatTemplateError, match="no tokenizer.chat_template"):
        ChatFormatter.from_metadata({"general.architecture": "llama",
                                     "general.name": "Mystery 1B"})


# ---------------------------------------------------------------- messages and helpers

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tool_calls_and_results_fold_into_text_for_plain_templates():
    f = ChatFormatter(CHATML)
    text = f.render([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"name": "get_weather", "arguments": '{"city": "Paris"}',
                         "id": "c00000000"}]},
        {"role": "tool", "name": "get_weather", "content": "sunny"},
    ], add_generation_prompt=False)
    assert ('<|im_start|>assistant\n<tool_call>{"name": "get_weather", '
            '"arguments": {"city": "Paris"}}</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n[get_weather result] sunny<|im_end|>" in text


def test_template_helpers_and_tools_variable():
    src = ("{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
           "{{ strftime_now('%Y') }}|{{ tools | tojson }}|{{ bos_token }}{{ messages[0].content }}")
    f = ChatFormatter(src, bos_token="<s>")
    assert f.supports_tools
    tools = [{"type": "function", "function": {"name": "f", "description": "a <b> & c"}}]
    out = f.render([{"role": "user", "content": "x"}], tools=tools)
    year, tools_json, rest = out.split("|")
    assert year.isdigit() and "a <b> & c" in tools_json and rest == "<s>x"
    with pytest.raises(ChatTemplateError, match="user first"):
        f.render([{"role": "assistant", "content": "x"}])


def test_invalid_messages_raise():
    f = ChatFormatter(CHATML)
    with pytest.raises(ChatTemplateError, match="role"):
        f.render([{"role": "narrator", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="not JSON"):
        f.render([{"role": "assistant", "content": "",
                   "tool_calls": [{"name": "f", "arguments": "{oops"}]}])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatFormatter("{% for %}")


def test_sandbox_blocks_attribute_escapes():
    f = ChatFormatter("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        f.render([{"role": "user", "content": "x"}])


# ---------------------------------------------------------------- token budget and prefix

@pytest.mark.model
@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_token_counts_per_message_add_up_to_the_prompt(which, request):
    path = request.getfixturevalue(MODEL_FIXTURE[which])
    tokenize = request.getfixturevalue(f"{which}_tok")
    f = ChatFormatter.from_gguf(path)
    prompt = f.render(CONVERSATION)
    spans = f.message_spans(CONVERSATION, tokenize=tokenize)
    assert [s.index for s in spans] == [0, 1, 2, 3, -1]
    assert spans[0].start == 0 and spans[-1].end == len(prompt)
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))
    counts = [s.n_tokens for s in spans]
    assert sum(counts) == len(tokenize(prompt))
    assert all(c > 0 for c in counts)
    # Each message's count is its content plus the template's fixed tokens around it.
    for s, m in zip(spans, CONVERSATION):
        content = len(tokenize(m["content"])) - (1 if f.add_bos else 0)
        assert content <= s.n_tokens <= content + 8
    assert f.count_tokens(CONVERSATION, tokenize) == counts


@pytest.mark.model
@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_stable_prefix_is_stable_when_the_last_user_message_changes(which, request):
    path = request.getfixturevalue(MODEL_FIXTURE[which])
    tokenize = request.getfixturevalue(f"{which}_tok")
    f = ChatFormatter.from_gguf(path)
    other = CONVERSATION[:-1] + [{"role": "user", "content": "Sell me an axe."}]
    p1 = f.stable_prefix(CONVERSATION, tokenize=tokenize)
    p2 = f.stable_prefix(other, tokenize=tokenize)
    p3 = f.stable_prefix(CONVERSATION[:2], tokenize=tokenize)  # another agent, same system
    assert p1 == p2 == p3
    assert "You are Bob, a blacksmith." in p1.text
    for conv in (CONVERSATION, other):
        prompt = f.render(conv)
        assert prompt[:p1.end] == p1.text
        # The prefix's tokens are a prefix of the prompt's tokens: its KV can be shared.
        assert tokenize(prompt)[:p1.n_tokens] == tokenize(p1.text)
