"""The metadata schema and the filter grammar: every op and operand against a reference
evaluation written record by record in Python, the missing-field rule, variables re-read
on each search, and each rejection naming its JSON path."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge.filters import FilterError, compile_filter
from tryll_fast.knowledge.metadata import Columns, Schema
from tryll_fast.workflow.variables import Variables

FIELDS = [
    {"name": "min_level", "type": "int", "default": 0},
    {"name": "weight", "type": "float", "default": 1.0},
    {"name": "topic", "type": "string", "default": ""},
    {"name": "secret", "type": "bool", "default": False},
    {"name": "classes", "type": "set<string>", "optional": True},
    {"name": "quest", "type": "string", "optional": True},
    {"name": "page", "type": "string", "default": "", "filterable": False},
]
RECORDS = [
    {"min_level": 1, "weight": 0.5, "topic": "combat", "classes": ["warrior", "paladin"]},
    {"min_level": 10, "topic": "magic", "classes": ["mage"], "quest": "intro"},
    {"min_level": 5, "weight": 2, "secret": True, "quest": "rescue"},
    {"topic": "combat", "classes": ["warrior"], "quest": "lost_amulet"},
    {"min_level": 12, "weight": 3.5, "topic": "lore"},
]


@pytest.fixture(scope="module")
def cols():
    return Columns(Schema.parse(FIELDS), RECORDS, "records")


def variables(**values):
    decls = []
    for name, v in values.items():
        if isinstance(v, bool):
            val = codec.VarBool(value=v)
        elif isinstance(v, int):
            val = codec.VarInt(value=v)
        elif isinstance(v, float):
            val = codec.VarFloat(value=v)
        elif isinstance(v, str):
            val = codec.VarString(value=v)
        else:
            val = codec.VarStringSet(values=sorted(v))
        decls.append(codec.AgentVariable(name=name, value=val))
    return Variables(decls)


def rows(cols, flt, vars_=None) -> list[int]:
    f = compile_filter(json.dumps(flt), cols.schema, (vars_ or variables()).kind)
    return np.flatnonzero(f.mask(cols, vars_ or variables())).tolist()


def test_schema_types_defaults_and_sets(cols):
    assert cols.record(3) == {"min_level": 0, "weight": 1.0, "topic": "combat",
                              "secret": False, "classes": ["warrior"],
                              "quest": "lost_amulet", "page": ""}
    assert "classes" not in cols.record(2) and "quest" not in cols.record(0)
    c = Columns(Schema.parse([{"name": "tags", "type": "set<string>", "default": []}]),
                [{"tags": ["b", "a", "b"]}], "r")
    assert c.record(0)["tags"] == ["a", "b"]            # sorted, deduplicated


@pytest.mark.parametrize("flt, expected", [
    ({"op": "ge", "lhs": {"value": 10}, "rhs": {"knowledge": "min_level"}}, [0, 1, 2, 3]),
    ({"op": "lt", "lhs": {"knowledge": "min_level"}, "rhs": {"value": 5.5}}, [0, 2, 3]),
    ({"op": "gt", "lhs": {"knowledge": "weight"}, "rhs": {"knowledge": "min_level"}}, [3]),
    ({"op": "eq", "lhs": {"knowledge": "topic"}, "rhs": {"value": "combat"}}, [0, 3]),
    ({"op": "ne", "lhs": {"value": "combat"}, "rhs": {"knowledge": "topic"}}, [1, 2, 4]),
    ({"op": "eq", "lhs": {"knowledge": "topic"}, "rhs": {"value": "nowhere"}}, []),
    ({"op": "eq", "lhs": {"knowledge": "secret"}, "rhs": {"value": True}}, [2]),
    ({"op": "in", "needle": {"value": "warrior"}, "haystack": {"knowledge": "classes"}},
     [0, 3]),
    ({"op": "in", "needle": {"knowledge": "quest"},
      "haystack": {"value": ["intro", "lost_amulet"]}}, [1, 3]),
    ({"op": "in", "needle": {"knowledge": "min_level"}, "haystack": {"value": [1, 12]}},
     [0, 4]),
    # an absent optional field makes the leaf false, and `not` inverts the leaf
    ({"op": "ne", "lhs": {"knowledge": "quest"}, "rhs": {"value": "intro"}}, [2, 3]),
    ({"op": "not", "arg": {"op": "eq", "lhs": {"knowledge": "quest"},
                           "rhs": {"value": "intro"}}}, [0, 2, 3, 4]),
    ({"op": "and", "args": [
        {"op": "ge", "lhs": {"value": 12}, "rhs": {"knowledge": "min_level"}},
        {"op": "in", "needle": {"value": "mage"}, "haystack": {"knowledge": "classes"}}]},
     [1]),
    ({"op": "or", "args": [
        {"op": "eq", "lhs": {"knowledge": "topic"}, "rhs": {"value": "lore"}},
        {"op": "eq", "lhs": {"knowledge": "secret"}, "rhs": {"value": True}}]}, [2, 4]),
    ({"op": "eq", "lhs": {"value": 1}, "rhs": {"value": 1.0}}, [0, 1, 2, 3, 4]),
])
def test_ops_select_the_records_a_reference_would(cols, flt, expected):
    assert rows(cols, flt) == expected


def test_variables_are_read_on_every_search(cols):
    v = variables(level=1, cls="mage", done={"intro"})
    f = compile_filter(json.dumps({"op": "and", "args": [
        {"op": "ge", "lhs": {"var": "level"}, "rhs": {"knowledge": "min_level"}},
        {"op": "not", "arg": {"op": "in", "needle": {"knowledge": "quest"},
                              "haystack": {"var": "done"}}}]}), cols.schema, v.kind)
    assert f.variables == {"level", "done"}
    assert np.flatnonzero(f.mask(cols, v)).tolist() == [0, 3]
    v.apply([codec.VariableUpdate(name="level", op=codec.VariableOp.Assign,
                                  value=codec.VarInt(value=12))])
    assert np.flatnonzero(f.mask(cols, v)).tolist() == [0, 2, 3, 4]
    v.apply([codec.VariableUpdate(name="done", op=codec.VariableOp.AddToSet,
                                  value=codec.VarString(value="rescue"))])
    assert np.flatnonzero(f.mask(cols, v)).tolist() == [0, 3, 4]
    g = compile_filter(json.dumps({"op": "in", "needle": {"var": "cls"},
                                   "haystack": {"knowledge": "classes"}}), cols.schema, v.kind)
    assert np.flatnonzero(g.mask(cols, v)).tolist() == [1]


def test_empty_filter_is_none(cols):
    assert compile_filter("", cols.schema, variables().kind) is None
    assert compile_filter("  ", cols.schema, variables().kind) is None


@pytest.mark.parametrize("flt, message", [
    ("{", "at the top: not JSON"),
    ({"op": "xor", "args": []}, "unknown op 'xor'"),
    ({"op": "and", "args": []}, 'at the top: "and" needs a non-empty "args"'),
    ({"op": "and", "args": [{"op": "eq", "lhs": {"knowledge": "topic"},
                             "rhs": {"value": 3}}]},
     "at args[0]: cannot compare string with int"),
    ({"op": "lt", "lhs": {"knowledge": "topic"}, "rhs": {"value": "a"}},
     '"lt" orders numbers'),
    ({"op": "eq", "lhs": {"knowledge": "nope"}, "rhs": {"value": 1}},
     "at lhs: unknown knowledge field 'nope'"),
    ({"op": "eq", "lhs": {"knowledge": "page"}, "rhs": {"value": "x"}},
     "at lhs: field 'page' is declared filterable: false"),
    ({"op": "eq", "lhs": {"agent": "level"}, "rhs": {"value": 1}},
     "at lhs: unknown operand namespace 'agent'"),
    ({"op": "eq", "lhs": {"var": "ghost"}, "rhs": {"value": 1}},
     "at lhs: unknown agent variable 'ghost'"),
    ({"op": "eq", "lhs": {"value": ["a"]}, "rhs": {"value": "a"}},
     "at lhs: an array literal can only be the haystack"),
    ({"op": "in", "needle": {"value": "a"}, "haystack": {"knowledge": "topic"}},
     "the haystack of \"in\" is a set<string> field"),
    ({"op": "in", "needle": {"value": 3}, "haystack": {"knowledge": "classes"}},
     "a needle of type int in a haystack of string values"),
    ({"op": "eq", "lhs": {"knowledge": "classes"}, "rhs": {"value": "a"}},
     "at lhs: set<string> field 'classes' can only be the haystack"),
    ({"op": "not", "arg": {"op": "eq", "lhs": {"value": True}, "rhs": {"value": None}}},
     "at arg.rhs: None is not an int"),
    ({"op": "eq", "lhs": {"value": 1}, "rhs": {"value": 1}, "extra": 1},
     "unexpected key(s) extra"),
])
def test_bad_filters_name_the_node(cols, flt, message):
    text = flt if isinstance(flt, str) else json.dumps(flt)
    with pytest.raises(FilterError) as exc:
        compile_filter(text, cols.schema, variables().kind)
    assert message in str(exc.value)


def test_depth_and_node_limits(cols):
    leaf = {"op": "eq", "lhs": {"value": 1}, "rhs": {"value": 1}}
    deep = leaf
    for _ in range(16):
        deep = {"op": "not", "arg": deep}
    with pytest.raises(FilterError, match="nested deeper than 16"):
        compile_filter(json.dumps(deep), cols.schema, variables().kind)
    wide = {"op": "or", "args": [leaf] * 256}
    with pytest.raises(FilterError, match="more than 256 nodes"):
        compile_filter(json.dumps(wide), cols.schema, variables().kind)


@pytest.mark.parametrize("fields, message", [
    ("x", "fields: must be an array"),
    ([{"name": "a", "type": "int"}], "needs exactly one of `default` or `optional: true`"),
    ([{"name": "a", "type": "int", "default": 1, "optional": True}], "exactly one of"),
    ([{"name": "a", "type": "date", "default": 1}], "fields[0].type: 'date' is not one of"),
    ([{"name": "a", "type": "int", "default": "x"}], "fields[0].default: 'x' is not an int"),
    ([{"name": "a", "type": "int", "default": 1}, {"name": "a", "type": "int", "default": 2}],
     "fields[1].name: 'a' is declared twice"),
])
def test_bad_schemas_are_8003_naming_the_field(fields, message):
    with pytest.raises(TryllError) as exc:
        Schema.parse(fields)
    assert exc.value.code == ErrorCode.InvalidEmbeddedStringStorageData
    assert message in exc.value.message


def test_records_are_checked_against_the_schema():
    schema = Schema.parse([{"name": "lvl", "type": "int", "default": 0}])
    with pytest.raises(TryllError, match=r"records\[1\].metadata.lvl: 'high' is not an int"):
        Columns(schema, [{"lvl": 1}, {"lvl": "high"}], "records")


def test_inferred_schema_for_inline_metadata():
    s = Schema.infer([{"a": 1, "b": "x"}, {"a": 2.5, "c": ["p"]}], "metadata_json")
    assert {f.name: (f.type, f.optional) for f in s.fields} == {
        "a": ("float", True), "b": ("string", True), "c": ("set<string>", True)}
    with pytest.raises(TryllError, match=r"metadata_json\[1\].a: is a string here and a int"):
        Schema.infer([{"a": 1}, {"a": "x"}], "metadata_json")
