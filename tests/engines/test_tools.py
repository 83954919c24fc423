"""Tool calls: prompt block, JSON schema, GBNF grammar, and the output parser."""
import json

import pytest

from tryll_fast import codec
from tryll_fast.prompting.chat import ChatFormatter
from tryll_fast.prompting.tools import (
    GENERIC, HERMES, JSON_BARE, MISTRAL, CallIds, ToolSet, mode_name, tool_signature_lines,
)

SMOL = "SmolLM2-135M-Instruct"


TOOLS = [
    {"name": "get_weather", "description": "Get the current weather for a city.",
     "parameters": [{"name": "city", "type": "string", "description": "City name"}]},
    {"name": "set_mood", "description": "Change the character's mood.",
     "parameters": [{"name": "mood", "type": "string", "enum_values": ["happy", "sad"]},
                    {"name": "level", "type": "integer", "required": False}]},
    {"name": "give_item", "description": "Give the player an item.",
     "parameters": [{"name": "item", "type": "string"},
                    {"name": "count", "type": "integer", "enum_values": ["1", "2", "3"]}]},
]


@pytest.fixture
def tools():
    return ToolSet(TOOLS, fmt=GENERIC)


@pytest.fixture
def ptools():
    return ToolSet(TOOLS, fmt=GENERIC, parallel_tool_calls=True)


WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


# ---------------------------------------------------------------- definitions and prompt

def test_codec_tool_definitions_and_dicts_are_equivalent():
    objs = [codec.ToolDefinition(
        name=t["name"], description=t["description"],
        parameters=[codec.ToolParamDefinition(**p) for p in t["parameters"]]) for t in TOOLS]
    assert ToolSet(objs).specs == ToolSet(TOOLS).specs
    spec = ToolSet(objs).by_name["give_item"]
    assert spec.params[1].enum == (1, 2, 3)


def test_invalid_definitions_raise():
    with pytest.raises(ValueError, match="duplicate"):
        ToolSet([TOOLS[0], TOOLS[0]])
    with pytest.raises(ValueError, match="type"):
        ToolSet([{"name": "f", "parameters": [{"name": "x", "type": "date"}]}])
    with pytest.raises(ValueError, match="at least one"):
        ToolSet([])


def test_mode_names():
    assert mode_name(codec.ToolCallMode.RequireCall) == "require_call"
    assert mode_name("CallOrAnswer") == "call_or_answer"
    assert mode_name(0) == "detect_only"


def test_signature_lines_match_seed_diagnostics(tools):
    assert tool_signature_lines(tools.specs)[:3] == [
        "get_weather(city: string) - Get the current weather for a city.",
        "  city - City name",
        "set_mood(mood: string, level?: integer) - Change the character's mood.",
    ]


def test_generic_block_goes_into_the_system_message(tools):
    msgs, template_tools = tools.apply([{"role": "system", "content": "You are Bob."},
                                        {"role": "user", "content": "Hi"}], "RequireCall")
    assert template_tools is None
    assert msgs[0]["content"].startswith("You are Bob.\n\n# Tools\n")
    assert "You must call one of these tools" in msgs[0]["content"]
    assert '<tool_call>{"name": "<tool name>"' in msgs[0]["content"]
    msgs, _ = tools.apply([{"role": "user", "content": "Hi"}], "CallOrAnswer")
    assert msgs[0]["role"] == "system" and "otherwise answer normally" in msgs[0]["content"]


def test_templates_with_tools_get_them_through_the_tools_variable():
    src = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
           "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
           "{# calls are written as <tool_call>...</tool_call> #}")
    f = ChatFormatter(src)
    ts = ToolSet(TOOLS, formatter=f)
    assert ts.format is HERMES
    msgs, template_tools = ts.apply([{"role": "user", "content": "Hi"}])
    text = f.render(msgs, tools=template_tools)
    assert text.startswith('<tools>{"type": "function", "function": {"name": "get_weather"')


# ---------------------------------------------------------------- schema and grammar

def test_call_schema_and_parallel_array(tools, ptools):
    s = tools.schema()
    assert [a["properties"]["name"]["const"] for a in s["oneOf"]] == \
        ["get_weather", "set_mood", "give_item"]
    args = s["oneOf"][1]["properties"]["arguments"]
    assert args["required"] == ["mood"] and args["additionalProperties"] is False
    assert args["properties"]["mood"]["enum"] == ["happy", "sad"]
    p = ptools.schema()
    assert p["type"] == "array" and p["items"] == s and p["minItems"] == 1
    assert ToolSet(TOOLS, fmt=MISTRAL).schema()["maxItems"] == 1


@pytest.fixture(scope="module")
def smol_vocab(smollm2):
    from llama_cpp import Llama
    return Llama(str(smollm2), vocab_only=True, verbose=False)


def _compiles(vocab_llm, grammar_text, lazy_patterns=()):
    import ctypes

    import llama_cpp.llama_cpp as C
    vocab = C.llama_model_get_vocab(vocab_llm._model.model)
    if lazy_patterns:
        pats = (ctypes.c_char_p * len(lazy_patterns))(*[p.encode() for p in lazy_patterns])
        smpl = C.llama_sampler_init_grammar_lazy_patterns(
            vocab, grammar_text.encode(), b"root", pats, len(lazy_patterns), None, 0)
    else:
        smpl = C.llama_sampler_init_grammar(vocab, grammar_text.encode(), b"root")
    ok = bool(smpl)
    if ok:
        C.llama_sampler_free(smpl)
    return ok


@pytest.mark.model
@pytest.mark.parametrize("fmt", [GENERIC, HERMES, MISTRAL, JSON_BARE], ids=lambda f: f.name)
@pytest.mark.parametrize("parallel", [False, True])
def test_gbnf_for_three_tools_compiles_in_llama_cpp(smol_vocab, fmt, parallel):
    ts = ToolSet(TOOLS, fmt=fmt, parallel_tool_calls=parallel)
    for mode in ("RequireCall", "CallOrAnswer", "DetectOnly"):
        g = ts.grammar(mode)
        assert g.lazy == (mode != "RequireCall")
        assert _compiles(smol_vocab, g.gbnf, g.trigger_patterns)
        assert _compiles(smol_vocab, g.eager_gbnf)
    assert not _compiles(smol_vocab, "root ::= nope")  # the check can fail


_TRIGGER_PROBE = """
import ctypes, sys
import llama_cpp.llama_cpp as C
from llama_cpp import Llama
sys.path.insert(0, sys.argv[2])
from test_tools import TOOLS
from tryll_fast.prompting.tools import GENERIC, HERMES, JSON_BARE, ToolSet
llm = Llama(sys.argv[1], vocab_only=True, verbose=False)
vocab = C.llama_model_get_vocab(llm._model.model)
texts = ["{\\n", "{}", "{{", " {", "{ ", '{"', '{"name": "get_weather"', "{\\n\\n  ",
         "<tool_call>", "<tool_call>\\n", "<tool_call>\\n\\n", "<tool_call>{}",
         "Sure. <tool_call> {", "[laughs] {", "{%"]
for fmt in (GENERIC, HERMES, JSON_BARE):
    for parallel in (False, True):
        g = ToolSet(TOOLS, fmt=fmt, parallel_tool_calls=parallel).grammar("CallOrAnswer")
        for text in texts:
            pats = (ctypes.c_char_p * len(g.trigger_patterns))(
                *[p.encode() for p in g.trigger_patterns])
            smpl = C.llama_sampler_init_grammar_lazy_patterns(
                vocab, g.gbnf.encode(), b"root", pats, len(pats), None, 0)
            # token by token as a sampler would: a token the (triggered) grammar masks
            # out could never be sampled, so the text stops there
            for tok in llm.tokenize(text.encode(), add_bos=False, special=True):
                data = (C.llama_token_data * 1)(C.llama_token_data(tok, 0.0, 0.0))
                arr = C.llama_token_data_array(data, 1, -1, False)
                C.llama_sampler_apply(smpl, ctypes.byref(arr))
                if data[0].logit == float("-inf"):
                    break
                C.llama_sampler_accept(smpl, tok)
            C.llama_sampler_free(smpl)
print("survived")
"""


@pytest.mark.model
def test_no_first_token_of_a_lazy_call_can_abort_the_process(smollm2, tmp_path):
    """llama.cpp feeds a lazy grammar the text from the trigger on and aborts the process
    when the grammar rejects it: every trigger must stop where the grammar accepts."""
    import os
    import subprocess
    import sys
    probe = tmp_path / "probe.py"
    probe.write_text(_TRIGGER_PROBE)
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, str(probe), str(smollm2), here],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr[-2000:]


@pytest.mark.model
def test_constrained_generation_yields_a_parseable_weather_call(smollm2):
    from llama_cpp import Llama, LlamaGrammar

    from tryll_fast.engines.llama import compute

    f = ChatFormatter.from_gguf(smollm2)
    ts = ToolSet([TOOLS[0]], formatter=f)
    msgs, template_tools = ts.apply(
        [{"role": "user", "content": "What's the weather in Paris?"}], "RequireCall")
    prompt = f.render(msgs, tools=template_tools)
    g = ts.grammar("RequireCall")
    llm = Llama(str(smollm2), n_ctx=1024, n_threads=2, n_threads_batch=2, seed=1,
                verbose=False)
    # on the compute thread, so this process keeps one OpenMP team (engines/llama/compute.py)
    out = compute.run(lambda: llm.create_completion(
        prompt, max_tokens=48, temperature=0.0,
        grammar=LlamaGrammar.from_string(g.gbnf, verbose=False),
        stop=list(f.stop_strings)))["choices"][0]["text"]
    res = ts.parse(out)
    assert not res.parse_fallback, (out, res.failure)
    (call,) = res.calls
    assert call.name == "get_weather" and call.id == "c00000000"
    assert isinstance(call.arguments["city"], str)
    print(f"\nSmolLM2 constrained call: {out!r}")


# ---------------------------------------------------------------- parser

def test_parse_single_call(tools):
    r = tools.parse(f"<tool_call>{WEATHER}</tool_call>")
    assert not r.parse_fallback and r.text == ""
    (c,) = r.calls
    assert (c.name, c.arguments, c.arguments_json, c.id) == \
        ("get_weather", {"city": "Paris"}, '{"city": "Paris"}', "c00000000")


def test_parse_keeps_raw_arguments_and_leading_text(tools):
    out = 'Let me check. <tool_call> {"name":"get_weather","arguments":{ "city" :"Paris" }} '
    r = tools.parse(out)  # no closing marker: the output ended (stop / max_tokens)
    assert r.text == "Let me check."
    assert r.calls[0].arguments_json == '{ "city" :"Paris" }'


def test_parse_parallel_calls_array_and_blocks(ptools):
    arr = ptools.parse('<tool_call>[' + WEATHER + ', {"name": "set_mood", "arguments": '
                       '{"mood": "sad", "level": 2}}]</tool_call>')
    blocks = ptools.parse(f"<tool_call>{WEATHER}</tool_call>\n<tool_call>"
                          '{"name": "give_item", "arguments": {"item": "axe", "count": 1}}'
                          "</tool_call>")
    for r, second in ((arr, "set_mood"), (blocks, "give_item")):
        assert not r.parse_fallback
        assert [c.name for c in r.calls] == ["get_weather", second]
        assert [c.id for c in r.calls] == ["c00000000", "c00000001"]


def test_second_call_without_parallel_is_malformed(tools):
    out = f"<tool_call>{WEATHER}</tool_call><tool_call>{WEATHER}</tool_call>"
    r = tools.parse(out)
    assert r.failure.kind == "malformed_call" and r.calls == ()
    assert r.failure.offset == out.index("<tool_call>", 1)
    assert "parallel_tool_calls is false" in r.failure.parse_error
    assert r.failure.excerpt == out[r.failure.offset:r.failure.offset + 48]


def test_prose_is_no_call(tools):
    r = tools.parse("It is sunny in Paris today.")
    assert r.parse_fallback and r.failure.kind == "no_call"
    assert r.text == "It is sunny in Paris today." and r.failure.offset == 0
    assert r.diagnostics() == {
        "parse_fallback": True, "text": "It is sunny in Paris today.",
        "parse_failure": "no_call",
        "parse_error": "no tool-call marker '<tool_call>' in the output; unparsed from "
                       'byte 0: "It is sunny in Paris today."'}


def test_broken_json_reports_the_exact_byte_offset(tools):
    out = 'Voilà <tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>'
    r = tools.parse(out)
    assert r.failure.kind == "malformed_call"
    assert "invalid JSON" in r.failure.reason
    bad = out.index("Paris}")
    assert r.failure.offset == len(out[:bad].encode()) == bad + 1  # 'à' is two bytes
    assert r.failure.excerpt == "Paris}}</tool_call>"
    assert r.text == out  # on failure the raw output is the text


def test_truncated_call_is_malformed(tools):
    r = tools.parse('<tool_call>{"name": "get_weather", "arguments": {"ci')
    assert r.failure.kind == "malformed_call" and r.failure.offset == 49


def test_unknown_tool_is_malformed(tools):
    out = '<tool_call>{"name": "cast_spell", "arguments": {}}</tool_call>'
    r = tools.parse(out)
    assert r.failure.kind == "malformed_call"
    assert r.failure.reason == "unknown tool 'cast_spell'"
    assert r.failure.offset == out.index('"cast_spell"')


def test_missing_required_argument_is_malformed(tools):
    out = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    r = tools.parse(out)
    assert r.failure.kind == "malformed_call"
    assert r.failure.reason == "tool 'get_weather': missing required argument 'city'"
    assert r.failure.offset == out.index("{}")


@pytest.mark.parametrize("args,reason", [
    ('{"mood": "angry"}', "argument 'mood' = 'angry' is not one of ['happy', 'sad']"),
    ('{"mood": "sad", "level": "high"}', "argument 'level' is not a integer"),
    ('{"mood": "sad", "volume": 3}', "unexpected argument 'volume'"),
])
def test_argument_validation(tools, args, reason):
    r = tools.parse('<tool_call>{"name": "set_mood", "arguments": ' + args + '}</tool_call>')
    assert r.failure.kind == "malformed_call" and r.failure.reason.endswith(reason)


def test_markerless_format_is_unclassified():
    ts = ToolSet(TOOLS, fmt=JSON_BARE)
    ok = ts.parse('{"name": "get_weather", "parameters": {"city": "Rome"}}')
    assert ok.calls[0].arguments == {"city": "Rome"}
    bad = ts.parse("The weather is fine.")
    assert bad.failure.kind == "unclassified"
    assert ts.parse('{"name": "get_weather", "parameters": {"city": }}').failure.kind == \
        "unclassified"


def test_mistral_array_format():
    ts = ToolSet(TOOLS, fmt=MISTRAL)
    r = ts.parse('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, '
                 '"id": "abc123xyz"}]')
    (c,) = r.calls
    assert c.model_id == "abc123xyz" and c.id == "c00000000"
    # in the diagnostics, `id` is the model's own and `call_id` the server's
    assert r.diagnostics()["tool_calls"] == [{"name": "get_weather", "call_id": "c00000000",
                                             "arguments_json": '{"city": "Oslo"}',
                                             "id": "abc123xyz"}]


@pytest.mark.parametrize("fmt", [GENERIC, HERMES], ids=lambda f: f.name)
@pytest.mark.parametrize("out", [
    WEATHER,
    "  " + WEATHER + "\n",
    "Let me see. " + WEATHER,
    "```json\n" + WEATHER + "\n```",
    "Of course, let me look.\n```\n" + WEATHER + "\n```\nOne moment.",
], ids=["bare", "bare-spaced", "after-prose", "fenced", "fenced-with-prose"])
def test_a_call_written_without_the_marker_is_recognised(fmt, out):
    r = ToolSet(TOOLS, fmt=fmt).parse(out)
    assert not r.parse_fallback, r.failure
    (c,) = r.calls
    assert (c.name, c.arguments) == ("get_weather", {"city": "Paris"})
    assert "{" not in r.text and "```" not in r.text


def test_bare_parallel_calls_and_a_second_bare_call_without_parallel():
    two = WEATHER + '\n{"name": "set_mood", "arguments": {"mood": "sad"}}'
    r = ToolSet(TOOLS, fmt=HERMES, parallel_tool_calls=True).parse(two)
    assert [c.name for c in r.calls] == ["get_weather", "set_mood"]
    single = ToolSet(TOOLS, fmt=HERMES).parse(two)
    assert single.failure.kind == "malformed_call" and single.prose == ""


@pytest.mark.parametrize("out,prose", [
    # a broken call attempt: only the prose before it may reach the player
    ('Here you go! {"name": "give_item", "arguments": {"item": "axe", "count": 9}}',
     "Here you go!"),
    ('```json\n{"name": "give_item", "arguments": {"item": "axe"}}\n```', ""),
    ('Sure. <tool_call>{"name": "cast_spell", "arguments": {}}</tool_call>', "Sure."),
    ('{"name": "get_weather", "arguments": {"city": Paris}}', ""),
])
def test_prose_of_a_failed_call_never_holds_the_call(tools, out, prose):
    r = tools.parse(out)
    assert r.calls == () and r.failure.kind == "malformed_call" and r.prose == prose


@pytest.mark.parametrize("out", [
    "```python\nprint('hello')\n```",
    '{"mood": "happy"} is how I feel.',
    "[laughs] Welcome, traveller!",
])
def test_json_or_code_that_names_no_call_is_prose(tools, out):
    r = tools.parse(out)
    assert r.failure.kind == "no_call" and r.prose == out.strip() and r.calls == ()


def test_lazy_grammar_triggers_on_the_marker_and_on_a_leading_brace():
    import re
    g = ToolSet(TOOLS, fmt=HERMES).grammar("CallOrAnswer")
    assert "bare-calls" in g.gbnf and g.gbnf.rstrip().endswith("root ::= calls | bare-calls")
    pats = [re.compile(p) for p in g.trigger_patterns]

    def fires(text):
        return [m.start(1) for p in pats if (m := p.fullmatch(text))]
    assert fires('  {"name"') == [2]
    assert fires("Well, <tool_call>{") == [6]
    assert fires("I'd say {this} is fine") == [] and fires("[smiles] Hello") == []
    assert ToolSet(TOOLS, fmt=HERMES).grammar("RequireCall").trigger_patterns == ()


def test_call_ids_count_per_node_execution(tools):
    ids = CallIds()
    first = tools.parse(f"<tool_call>{WEATHER}</tool_call>", ids)
    failed = tools.parse("no call here", ids)  # consumes no id
    second = tools.parse(f"<tool_call>{WEATHER}</tool_call>", ids)
    assert [first.calls[0].id, second.calls[0].id] == ["c00000000", "c00000001"]
    assert failed.calls == ()
    out = json.loads(json.dumps(second.diagnostics()))["tool_calls"][0]
    assert out["call_id"] == "c00000001" and "id" not in out     # the model wrote none


def test_tool_block_is_part_of_the_stable_prefix():
    f = ChatFormatter("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                      "<|im_end|>\n{% endfor %}")
    ts = ToolSet(TOOLS, formatter=f)
    system = {"role": "system", "content": "You are Bob."}
    a, _ = ts.apply([system, {"role": "user", "content": "Hi"}])
    b, _ = ts.apply([system, {"role": "user", "content": "Where is the inn?"}])
    pa, pb = f.stable_prefix(a), f.stable_prefix(b)
    assert pa == pb
    assert "You are Bob.\n\n# Tools" in pa.text and '"name": "give_item"' in pa.text


def test_a_chain_of_thought_is_reported_never_parsed_or_answered(tools):
    from tryll_fast.prompting.tools import split_reasoning
    thought, rest = split_reasoning(
        f"<think>The player wants the weather in Oslo. I could call it as "
        f"<tool_call>{{}}</tool_call>.</think>\n\n<tool_call>{WEATHER}</tool_call>")
    assert thought.startswith("The player wants") and thought.endswith("</tool_call>.")
    (call,) = tools.parse(rest).calls            # the call after it, not the one inside
    assert call.name == "get_weather"
    # a thought the token budget cut off leaves nothing to answer with
    assert split_reasoning("<think>Hmm, the weather") == ("Hmm, the weather", "")
    assert split_reasoning("No thinking here.") == ("", "No thinking here.")
    assert split_reasoning("I <think> so.") == ("", "I <think> so.")   # only an opening one
