"""The generated codec is checked in: regenerating it must change nothing,
and the schema parser must refuse what the generator cannot honour."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

from fbs import SchemaError, parse  # noqa: E402


def test_regenerating_changes_nothing():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_codec.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


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
