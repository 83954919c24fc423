"""Agent variables: declaration, atomic batches, every error code of the wire protocol."""
import math

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.workflow.variables import MAX_SET_ELEMENTS, Variables

Op = codec.VariableOp


def decl(name, value):
    return codec.AgentVariable(name=name, value=value)


def up(name, op, value=None):
    return codec.VariableUpdate(name=name, op=op, value=value)


@pytest.fixture
def store():
    return Variables([
        decl("gold", codec.VarInt(value=10)),
        decl("trust", codec.VarFloat(value=0.5)),
        decl("mood", codec.VarString(value="calm")),
        decl("met", codec.VarBool(value=False)),
        decl("quests", codec.VarStringSet(values=["bread"])),
    ])


def code_of(fn):
    with pytest.raises(TryllError) as info:
        fn()
    return info.value.code, info.value.message


def test_snapshot_in_declaration_order(store):
    snap = store.snapshot()
    assert [v.name for v in snap] == ["gold", "trust", "mood", "met", "quests"]
    assert snap[0].value.value == 10 and list(snap[4].value.values) == ["bread"]
    assert store.template_view() == {"gold": 10, "trust": 0.5, "mood": "calm", "met": False,
                                     "quests": ["bread"]}


def test_every_op(store):
    store.apply([up("gold", Op.Assign, codec.VarInt(value=99)),
                 up("quests", Op.AddToSet, codec.VarString(value="wolves")),
                 up("quests", Op.AddToSet, codec.VarString(value="wolves")),     # no-op
                 up("quests", Op.RemoveFromSet, codec.VarString(value="bread")),
                 up("quests", Op.RemoveFromSet, codec.VarString(value="absent")),  # no-op
                 up("met", Op.Assign, codec.VarBool(value=True))])
    assert store.get("gold") == 99 and store.get("quests") == {"wolves"} and store.get("met")
    store.apply([up("gold", Op.Reset), up("quests", Op.Reset)])
    assert store.get("gold") == 10 and store.get("quests") == {"bread"}


@pytest.mark.parametrize("update,code,words", [
    (up("nope", Op.Assign, codec.VarInt(value=1)), ErrorCode.UnknownVariable, "no variable"),
    (up("gold", Op.Assign, codec.VarString(value="x")), ErrorCode.VariableTypeMismatch,
     "the variable is int, the value is string"),
    (up("trust", Op.Assign, codec.VarInt(value=1)), ErrorCode.VariableTypeMismatch, "float"),
    (up("mood", Op.AddToSet, codec.VarString(value="x")), ErrorCode.VariableTypeMismatch,
     "needs a string_set"),
    (up("quests", Op.AddToSet, codec.VarInt(value=1)), ErrorCode.VariableTypeMismatch,
     "takes a VarString"),
    (up("gold", Op.Assign), ErrorCode.InvalidVariableValue, "a value is required"),
    (up("quests", Op.AddToSet), ErrorCode.InvalidVariableValue, "a value is required"),
    (up("gold", Op.Reset, codec.VarInt(value=1)), ErrorCode.InvalidVariableValue,
     "Reset takes no value"),
    (up("gold", 9, codec.VarInt(value=1)), ErrorCode.InvalidVariableValue, "not a VariableOp"),
    (up("trust", Op.Assign, codec.VarFloat(value=math.nan)), ErrorCode.InvalidVariableValue,
     "not a finite number"),
    (up("mood", Op.Assign, codec.VarString(value="x" * 70000)), ErrorCode.InvalidVariableValue,
     "characters"),
])
def test_a_bad_update_fails_the_whole_batch(store, update, code, words):
    before = store.snapshot()
    good = up("gold", Op.Assign, codec.VarInt(value=5))
    got, message = code_of(lambda: store.apply([good, update]))
    assert got == code and words in message and "updates[1]" in message
    assert store.snapshot() == before        # the good first update was not applied


def test_sets_are_capped_at_4096(store):
    many = [up("quests", Op.AddToSet, codec.VarString(value=f"q{i}"))
            for i in range(MAX_SET_ELEMENTS - 1)]
    store.apply(many)
    assert len(store.get("quests")) == MAX_SET_ELEMENTS
    code, message = code_of(lambda: store.apply(
        [up("quests", Op.AddToSet, codec.VarString(value="one more"))]))
    assert code == ErrorCode.InvalidVariableValue and "4096" in message
    store.apply([up("quests", Op.AddToSet, codec.VarString(value="q1"))])   # present: fine
    big = codec.VarStringSet(values=[str(i) for i in range(MAX_SET_ELEMENTS + 1)])
    code, _ = code_of(lambda: store.apply([up("quests", Op.Assign, big)]))
    assert code == ErrorCode.InvalidVariableValue


@pytest.mark.parametrize("decls,words", [
    ([decl("a", codec.VarInt(value=1)), decl("a", codec.VarInt(value=2))], "declared twice"),
    ([decl("", codec.VarInt(value=1))], "not a variable name"),
    ([decl("has space", codec.VarInt(value=1))], "not a variable name"),
    ([decl("x.y", codec.VarInt(value=1))], "not a variable name"),
    ([decl("a", None)], "a value is required"),
])
def test_bad_declarations_are_3003(decls, words):
    code, message = code_of(lambda: Variables(decls))
    assert code == ErrorCode.GraphCompilationFailed and words in message
