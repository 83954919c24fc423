"""Generated code is checked in: regenerating the codec or the error classes must change
nothing, and the schema parser must refuse what the generator cannot honour."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from fbs import SchemaError, parse  # noqa: E402


@pytest.mark.parametrize("tool", ["gen_codec.py", "gen_errors.py", "ship_layout.py",
                                  "gen_client.py"])
def test_regenerating_changes_nothing(tool):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", tool), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_error_classes_follow_the_table():
    import gen_errors
    from tryll_fast import errors
    families = gen_errors.parse()
    for fam in families:
        cls = getattr(errors, fam.name)
        assert issubclass(cls, errors.TryllError)
        for c in fam.codes:
            leaf = getattr(errors, c.name)
            assert issubclass(leaf, cls) and leaf.code == c.value
            assert errors.error_class(c.value) is leaf
            raised = errors.TryllError(c.value, "m")        # the base picks the class
            assert type(raised) is leaf and raised.code == c.value and raised.message == "m"
    assert issubclass(errors.MalformedMessage, ValueError)   # the codec's errors are these
    from tryll_fast import codec
    assert codec.MalformedMessage is errors.MalformedMessage
    assert issubclass(codec.EncodeError, errors.ProtocolError)


def test_generated_module_matches_schema():
    from tryll_fast import codec
    schema = parse(os.path.join(ROOT, "schema", "messages.fbs"))
    tables = {d.name for d in schema.decls.values() if type(d).__name__ == "Table"}
    assert {t.__name__ for t in codec.TABLES} == tables
    for cls in codec.TABLES:
        decl = schema.decls[cls.__name__]
        assert cls.FIELDS == tuple(f.name for f in decl.fields if not f.deprecated)


@pytest.mark.parametrize("body, message", [
    ("table T { a: int (id: 0); }", "id/required/key"),
    ("table T { s: string = null; }", "only scalars and enums can be optional"),
    ("struct S { a: int = null; }", "struct fields cannot be optional"),
    ("table T { s: string (required); }", "id/required/key"),
    ("table U {} union X { U } table T { v: [X]; }", "vectors of unions"),
    ("table T { v: [[int]]; }", "vectors of vectors"),
    ("enum E : float { A }", "not an integer type"),
    ("enum E : ubyte { A = 256 }", "does not fit"),
    ("table T { a: Missing; }", "unknown type"),
    ("table T { a: int; a: int; }", "duplicate field"),
    ("table T { a: int (mystery); }", "undeclared attribute"),
    ("table T { s: string = \"x\"; }", "string defaults"),
    ("rpc_service S { }", "unsupported declaration"),
])
def test_parser_rejects_unsupported_schema(tmp_path, body, message):
    path = tmp_path / "bad.fbs"
    path.write_text("namespace X;\n" + body + "\n")
    with pytest.raises(SchemaError, match=message):
        parse(str(path))


def test_the_client_methods_are_written_out_for_both_clients():
    import inspect
    from tryll_fast.client import Agent, AsyncAgent, AsyncTryllClient, TryllClient
    from tryll_fast.client.core import Calls
    from tryll_fast.client.dialog import DialogCalls
    for described, (sync, aio) in ((Calls, (TryllClient, AsyncTryllClient)),
                                   (DialogCalls, (Agent, AsyncAgent))):
        names = [n for n in vars(described) if not n.startswith("_")]
        assert names
        for name in names:
            for cls in (sync, aio):
                method = getattr(cls, name)
                # written out in the generated mixin (the class's first base), not patched in
                assert name in vars(inspect.getmro(cls)[1])
                assert method.__doc__ and callable(getattr(cls, name + "_async"))
            assert not inspect.iscoroutinefunction(getattr(sync, name))
            assert inspect.iscoroutinefunction(getattr(aio, name))
            want = list(inspect.signature(getattr(described, name)).parameters)[1:]
            got = list(inspect.signature(getattr(sync, name)).parameters)[1:]
            assert got[:len(want)] == want and got[-1] == "timeout"
