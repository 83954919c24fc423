"""The layers, checked on the source: the workflow, the server, the gateway and the model
manager depend on the engine roles (tryll_fast/engines/roles.py, registry.py), never on an
engine package; one error base; agent state assigned only by the agent."""
import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "tryll_fast"


def imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports (relative imports resolved), at any depth."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


LAYERED = sorted(p for sub in ("workflow", "server", "client", "prompting", "voice_input",
                                         "knowledge", "gateway")
                 for p in (PKG / sub).rglob("*.py")) + [PKG / "models" / "manager.py"]


@pytest.mark.parametrize("path", LAYERED, ids=lambda p: str(p.relative_to(PKG)))
def test_no_engine_package_above_the_engines(path):
    engine_imports = {m for m in imports(path) if m.startswith("tryll_fast.engines.")
                      and m.split(".")[2] not in ("roles", "registry", "errors")}
    assert not engine_imports, f"{path.name} imports {sorted(engine_imports)}"


def test_the_walker_sees_imports():
    """The check above can fail: the llama engine itself imports its package."""
    assert "tryll_fast.engines.llama.model" in imports(PKG / "engines" / "llama" / "engine.py")
    assert "tryll_fast.engines.llama.model.LlamaModel" in imports(
        PKG / "engines" / "llama" / "engine.py")


def test_one_error_base_and_one_code_enum():
    enums, bases = [], []
    for path in PKG.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^class (\w+)\((?:enum\.)?IntEnum\):", text, re.M):
            body = text[m.end():m.end() + 2000]
            if re.search(r"=\s*[2-8]\d{3}\b", body.split("\nclass ")[0]):
                enums.append(f"{path.relative_to(PKG)}:{m.group(1)}")
        for m in re.finditer(r"^class (\w+)\((Exception|ValueError|RuntimeError)\):", text,
                             re.M):
            bases.append(f"{path.relative_to(PKG)}:{m.group(1)}")
    assert enums == ["errors/_codes.py:ErrorCode"]
    # exceptions that are not protocol errors, each for a stated reason
    assert sorted(bases) == sorted([
        "errors/__init__.py:TryllError",
        "client/errors.py:ReaderThreadError",     # a programming error in the game
        "models/catalog.py:CatalogError",         # a bad catalog file, at startup
        "server/config.py:ConfigError",           # a bad server config, at startup
        # caught and turned into a protocol error (3003 / 3007 / 4001) where they surface
        "prompting/chat.py:ChatTemplateError",
        "workflow/projection.py:ProjectionError",
        "workflow/templates.py:TemplateError",
        "knowledge/filters.py:FilterError",
        "gateway/elements.py:ElementError",     # a pipeline client's bad input: an error element
        # control flow inside one turn or one parse, never seen outside it
        "workflow/turn.py:TurnFailure", "workflow/turn.py:TurnCancelled",
        "workflow/turn.py:TurnTimedOut", "prompting/tool_parse.py:_Fail",
    ]), bases


def test_agent_state_is_assigned_only_by_the_agent():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path == PKG / "workflow" / "agent.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bagent\.(_?state)\s*=[^=]", line):
                offenders.append(f"{path.relative_to(PKG)}:{n}")
    assert offenders == []
