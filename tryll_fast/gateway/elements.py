"""Pipeline elements and their three encodings, TEXT, JSON and MSGPACK (the original
product's pipeline protocol; docs/pipeline.md has the tables).

An element is a type name and a dict of fields (`Element`). The same object model travels
both ways; only the encoding differs, chosen per connection and per direction:
- JSON: an object whose `type` property names the element type, then its fields;
- MSGPACK: a map with exactly one key, the type name, whose value is the field map;
  byte fields are native binary;
- TEXT: human-readable strings: `#name:key=value&key=value` for control messages, plain
  text for tokens (and for speech text), `#<type>:<json>` for the structured output
  types; `#element:<json>` carries any element over TEXT.

JSON and TEXT carry byte fields (binary.bytes, speech-item's item.bytes) as base64.
Protocol version 1 names the multimodal interaction `MultimodalInteractionElement` in
JSON and MSGPACK; both names are read in every version.

The error element has a field named `type`, as the JSON discriminator is (the original
protocol's own field). JSON output writes the discriminator first and the error's own `type` as the last
key of that name, which is what a JSON parser keeps; this decoder reads both (the first
`type` is the discriminator), and an object whose single `type` is no element type but
which has `source` and `message` is read as an error.

This runs once per streamed token, on the gateway's loop: plain Python, one dict and one
`json.dumps` / `msgpack.packb` per element, no classes per field. Measure before making
anything cleverer.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import time
from typing import Any, NamedTuple
from urllib.parse import unquote

import msgpack

TEXT, JSON, MSGPACK = "TEXT", "JSON", "MSGPACK"
FORMATS = (TEXT, JSON, MSGPACK)

INPUT_TYPES = ("token", "transcript", "binary", "url", "commit", "sensory", "action")
OUTPUT_TYPES = ("command", "speech-item", "speech", "token", "transcript", "visual-state",
                "multimodal-interaction", "navigation-specification", "evaluation-status",
                "error")
OUTPUT_ENVELOPE = ("sessionId", "turnId", "time")     # on every output element, first
LEGACY_MULTIMODAL = "MultimodalInteractionElement"
_ALIASES = {LEGACY_MULTIMODAL: "multimodal-interaction"}
KNOWN_TYPES = frozenset(INPUT_TYPES + OUTPUT_TYPES)
PROTOCOL_VERSIONS = (1, 2)

# output types TEXT renders as `#<type>:<json of one field>`
_JSON_IN_TEXT = {"speech-item": "item", "visual-state": "state",
                 "navigation-specification": "specification",
                 "evaluation-status": "status", "multimodal-interaction": "interaction"}
# Fields each input type may carry: (name, kind, required). Kinds: str, bool, number,
# bytes, list, dict. Fields not listed are ignored (a newer client's); a listed field of
# the wrong kind is an error naming it.
INPUT_FIELDS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "token": (("text", "str", True),),
    "transcript": (("text", "str", True), ("isInterim", "bool", False),
                   ("isSynthetic", "bool", False), ("isAsynchronous", "bool", False),
                   ("provider", "str", False)),
    "binary": (("bytes", "bytes", True), ("contentType", "str", False)),
    "url": (("url", "str", True),),
    "commit": (),
    "sensory": (("voiceDirection", "number", False), ("temperature", "number", False),
                ("illuminance", "number", False), ("ambientNoise", "number", False),
                ("isWhiteCaneDetected", "bool", False), ("isWheelChairDetected", "bool", False),
                ("persons", "list", False)),
    "action": (("name", "str", True), ("text", "str", False), ("parameters", "dict", False)),
}
SENTENCE_ENDS = ".!?…。！？"


class Element(NamedTuple):
    type: str                 # the canonical type name ("token", "multimodal-interaction")
    fields: dict[str, Any]


class ElementError(ValueError):
    """Bytes or text that are not a valid input element. `kind` is the error element's type
    (MalformedElement, UnknownElementType, NotAnInputElement, InvalidField)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def now_ms() -> int:
    return int(time.time() * 1000)


def output(kind: str, session_id: str | None, turn_id: str | None, **fields: Any) -> Element:
    """An output element: sessionId, turnId (None for session-scoped ones) and time first,
    then its own fields."""
    return Element(kind, {"sessionId": session_id, "turnId": turn_id, "time": now_ms(),
                          **fields})


def wire_name(kind: str, protocol_version: int) -> str:
    if protocol_version == 1 and kind == "multimodal-interaction":
        return LEGACY_MULTIMODAL
    return kind


def with_sentence_separator(text: str) -> str:
    """A client transcript's text ends a sentence: '.' is appended when it ends with no
    sentence mark (docs/pipeline.md, "Turns"); empty text stays empty."""
    stripped = text.rstrip()
    if not stripped or stripped[-1] in SENTENCE_ENDS:
        return stripped
    return stripped + "."


# ---- encoding ----

def encode(element: Element, fmt: str, protocol_version: int = 1) -> str | bytes:
    """TEXT and JSON give a str (a text frame / the `text` event), MSGPACK bytes."""
    if fmt == JSON:
        return encode_json(element, protocol_version)
    if fmt == MSGPACK:
        return encode_msgpack(element, protocol_version)
    return encode_text(element)


def _json_default(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_json_default)


_JSON_HEADS: dict[str, str] = {}


def encode_json(element: Element, protocol_version: int = 1) -> str:
    name = wire_name(element.type, protocol_version)
    head = _JSON_HEADS.get(name)
    if head is None:
        head = _JSON_HEADS[name] = '{"type":' + json.dumps(name)
    body = _dumps(element.fields)
    # the discriminator first; an error's own `type` follows as a second key of that name
    return head + ("," + body[1:] if len(body) > 2 else "}")


def encode_msgpack(element: Element, protocol_version: int = 1) -> bytes:
    return msgpack.packb({wire_name(element.type, protocol_version): element.fields},
                         use_bin_type=True)


_TEXT_ESCAPES = str.maketrans({"%": "%25", "&": "%26", "=": "%3D", "\n": "%0A", "\r": "%0D"})


def text_value(value: Any) -> str:
    """A parameter value in TEXT: strings as they are, true/false, numbers, JSON else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return repr(value)
    return _dumps(value)


def format_params(params: dict[str, Any]) -> str:
    """key=value&key=value; '%', '&', '=' and line breaks percent-encoded."""
    return "&".join(f"{str(k).translate(_TEXT_ESCAPES)}={text_value(v).translate(_TEXT_ESCAPES)}"
                    for k, v in params.items())


def parse_params(text: str) -> dict[str, str]:
    """The inverse of format_params; a key with no '=' has the value ''."""
    out: dict[str, str] = {}
    for piece in text.split("&"):
        if not piece:
            continue
        key, _, value = piece.partition("=")
        out[unquote(key)] = unquote(value)
    return out


def _control(name: str, params: dict[str, Any]) -> str:
    return f"#{name}:{format_params(params)}" if params else f"#{name}"


def encode_text(element: Element) -> str:
    kind, f = element.type, element.fields
    if kind == "token" or kind == "speech":
        return f.get("text", "")
    if kind == "command":
        return _control(f.get("name", ""), f.get("parameters") or {})
    if kind == "error":
        return _control("error", {k: f[k] for k in ("message", "source", "type", "description",
                                                    "isRecoverable") if k in f})
    if kind == "transcript":
        return _control("transcript", {k: f[k] for k in ("text", "isInterim", "isSynthetic",
                                                         "isAsynchronous", "provider")
                                       if k in f})
    inner = _JSON_IN_TEXT.get(kind)
    if inner is not None:
        return f"#{kind}:{_dumps(f.get(inner))}"
    if kind == "commit":
        return "#commit"
    if kind == "url":
        return "#url:" + f.get("url", "")
    if kind == "binary":
        data = base64.b64encode(f.get("bytes", b"")).decode("ascii")
        content_type = f.get("contentType")
        return f"#binary:{content_type},{data}" if content_type else f"#binary:{data}"
    if kind in KNOWN_TYPES:               # sensory, action: no shorthand of their own
        return "#element:" + encode_json(element, 2)
    return _control("error", {"message": f"a {kind} element has no TEXT form: use an "
                                         "outputFormat of JSON or MSGPACK"})


# ---- decoding ----

def decode_input(data: str | bytes, fmt: str) -> Element:
    """What a client sent, checked: an input element or ElementError."""
    if fmt == TEXT:
        if not isinstance(data, str):
            raise ElementError("MalformedElement", "a TEXT connection takes text frames")
        return decode_text_input(data)
    if fmt == JSON:
        if not isinstance(data, str):
            raise ElementError("MalformedElement", "a JSON connection takes text frames")
        return check_input(*_parse_json(data))
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ElementError("MalformedElement", "a MSGPACK connection takes binary frames "
                                               "(the Socket.IO msgpack event)")
    return check_input(*_parse_msgpack(data))


def decode_output(data: str | bytes, fmt: str) -> Element:
    """What the pipeline sent (for clients and tests); shapes only, no field checks."""
    if fmt == TEXT:
        return decode_text_output(data)
    if fmt == JSON:
        kind, fields = _parse_json(data)
    else:
        kind, fields = _parse_msgpack(data)
    if kind == "speech-item" and isinstance(fields.get("item"), dict):
        _unbase64(fields["item"], "bytes")
    return Element(kind, fields)


def decode_text_input(text: str) -> Element:
    if not text.startswith("#"):
        return Element("token", {"text": text})
    if text == "#commit":
        return Element("commit", {})
    if text.startswith("#url:"):
        return Element("url", {"url": text[5:]})
    if text.startswith("#binary:"):
        payload = text[8:]
        content_type, comma, data = payload.partition(",")
        fields: dict[str, Any] = {"bytes": data if comma else payload}
        if comma:
            fields["contentType"] = content_type
        return check_input("binary", fields)
    if text.startswith("#transcript:"):
        params = parse_params(text[12:])
        if "text" not in params:
            raise ElementError("InvalidField", "#transcript: needs text=… (e.g. "
                                               "#transcript:text=hello&isInterim=false)")
        fields = {"text": with_sentence_separator(params["text"]),
                  "isInterim": _text_bool(params, "isInterim"), "provider": "Client"}
        return check_input("transcript", fields)
    if text.startswith("#element:"):
        return check_input(*_parse_json(text[9:]))
    return Element("token", {"text": text})        # an action trigger: resolved later


def decode_text_output(text: str) -> Element:
    if not text.startswith("#"):
        return Element("token", {"text": text})
    name, _, rest = text[1:].partition(":")
    inner = _JSON_IN_TEXT.get(name)
    if inner is not None:
        try:
            value = json.loads(rest)
        except ValueError as exc:
            raise ElementError("MalformedElement", f"#{name}: not JSON: {exc}") from None
        if name == "speech-item" and isinstance(value, dict):
            _unbase64(value, "bytes")
        return Element(name, {inner: value})
    params = parse_params(rest)
    if name == "error":
        fields: dict[str, Any] = dict(params)
        if "isRecoverable" in params:
            fields["isRecoverable"] = _text_bool(params, "isRecoverable")
        return Element("error", fields)
    if name == "transcript":
        fields = dict(params)
        for key in ("isInterim", "isSynthetic", "isAsynchronous"):
            if key in params:
                fields[key] = _text_bool(params, key)
        return Element("transcript", fields)
    return Element("command", {"name": name, "parameters": params})


def _text_bool(params: dict[str, str], key: str) -> bool:
    value = params.get(key, "false").strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no", ""):
        return False
    raise ElementError("InvalidField", f"{key}={params[key]!r}: expected true or false")


_OWN_TYPE = "\x00type"     # an object's second `type` key (an error's own type)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key == "type" and "type" in out:
            out[_OWN_TYPE] = value
        else:
            out[key] = value
    return out


def _parse_json(text: str) -> tuple[str, dict[str, Any]]:
    try:
        obj = json.loads(text, object_pairs_hook=_pairs)
    except ValueError as exc:
        raise ElementError("MalformedElement", f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ElementError("MalformedElement", "a JSON element is an object with a \"type\" "
                                               f"property, not {_json_kind(obj)}")
    kind = obj.pop("type", None)
    if not isinstance(kind, str):
        raise ElementError("MalformedElement", "the JSON object has no \"type\" property "
                                               "naming the element type (e.g. "
                                               "{\"type\": \"token\", \"text\": \"hi\"})")
    own = obj.pop(_OWN_TYPE, None)
    if own is not None:
        obj["type"] = own
    elif kind not in KNOWN_TYPES and kind not in _ALIASES and "source" in obj \
            and "message" in obj:
        obj["type"] = kind            # a parser that kept only the error's own type
        kind = "error"
    return _ALIASES.get(kind, kind), obj


def _parse_msgpack(data: bytes) -> tuple[str, dict[str, Any]]:
    try:
        obj = msgpack.unpackb(data, raw=False)
    except Exception as exc:          # msgpack raises several unrelated classes
        raise ElementError("MalformedElement", f"not valid MessagePack: {exc}") from None
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ElementError("MalformedElement",
                           "a MSGPACK element is a map with exactly one key, the type name "
                           "(e.g. {\"token\": {\"text\": \"hi\"}}), not "
                           + (f"a map of {len(obj)} keys" if isinstance(obj, dict)
                              else _json_kind(obj)))
    ((kind, fields),) = obj.items()
    if not isinstance(kind, str):
        raise ElementError("MalformedElement", "the MSGPACK map's key must be the type name")
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise ElementError("MalformedElement", f"{kind}: the element's value must be a map "
                                               f"of its fields, not {_json_kind(fields)}")
    return _ALIASES.get(kind, kind), fields


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def check_input(kind: str, fields: dict[str, Any]) -> Element:
    """An input element's fields checked against INPUT_FIELDS."""
    spec = INPUT_FIELDS.get(kind)
    if spec is None:
        if kind in KNOWN_TYPES:
            raise ElementError("NotAnInputElement",
                               f"{kind} is an output element: the pipeline sends it, a client "
                               f"cannot (input types: {', '.join(INPUT_TYPES)})")
        raise ElementError("UnknownElementType", f"unknown element type {kind!r} (input types: "
                                                 f"{', '.join(INPUT_TYPES)})")
    for name, expected, required in spec:
        value = fields.get(name)
        if value is None:
            if required:
                raise ElementError("InvalidField", f"{kind}.{name} is required")
            continue
        if expected == "bytes":
            fields[name] = _as_bytes(kind, name, value)
        elif not _is_kind(value, expected):
            raise ElementError("InvalidField", f"{kind}.{name} must be {_KIND_WORDS[expected]}, "
                                               f"not {_json_kind(value)}")
    return Element(kind, fields)


_KIND_WORDS = {"str": "a string", "bool": "true or false", "number": "a finite number",
               "list": "an array", "dict": "an object / map"}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "number":
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value))
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, dict)


def _as_bytes(kind: str, name: str, value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ElementError("InvalidField", f"{kind}.{name} is not valid base64") from None
    raise ElementError("InvalidField", f"{kind}.{name} must be base64 text or binary, not "
                                       f"{_json_kind(value)}")


def _unbase64(fields: dict[str, Any], name: str) -> None:
    value = fields.get(name)
    if isinstance(value, str):
        fields[name] = _as_bytes("speech-item", name, value)
