"""The official FlatBuffers runtime for our schema: flatc-generated Python.

Generated once per process into a temporary directory (never checked in), so
the baseline is always exactly what `flatc --python` makes of schema/."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DIR = None


def flatc_path():
    here = os.path.join(os.path.dirname(sys.executable), "flatc")
    return here if os.path.exists(here) else shutil.which("flatc")


def load():
    """Generate (once) and import the reference module.

    One file (`--gen-onefile --gen-all`): flatc's per-file Python output does
    not import the union `*Creator` helpers its object API calls."""
    global _DIR
    if _DIR is None:
        _DIR = tempfile.mkdtemp(prefix="tryll-ref-")
        subprocess.run(
            [flatc_path(), "--python", "--gen-object-api", "--gen-onefile", "--gen-all",
             "-o", _DIR, os.path.join(ROOT, "schema", "messages.fbs")],
            check=True, capture_output=True)
        sys.path.insert(0, _DIR)
    import messages_generated
    return messages_generated

