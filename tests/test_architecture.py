"""The import rules of docs/architecture.md, checked on the source (every import, also inside functions).

Why a test: the plan/stage/engine split is what lets two engines share stages and produce the
same bytes; one convenient import across the line (a stage calling an engine helper, an engine
special-casing a stage) is how a second system grows. No exceptions are listed here on purpose.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "datakit"


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _imports(path: Path, module: str | None = None) -> set[str]:
    """Every `datakit...` module a file imports, at any depth (lazy imports count too); relative
    imports are resolved against the file's package (`module`: the file's dotted name, else its path's)."""
    out: set[str] = set()
    parts = module.split(".") if module else list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    package = parts if path.name == "__init__.py" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if _under(a.name, "datakit")}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - (node.level - 1)] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if _under(name, "datakit"):
                out.add(name)
                out |= {f"{name}.{a.name}" for a in node.names}
    return out


def _modules(sub: str) -> list[Path]:
    root = PKG / sub
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


# docs/architecture.md, "Who imports whom": (which files, which imports they must not have)
RULES = [
    ("stages", ("datakit.engines", "datakit.pipeline", "datakit.indexing", "datakit.cli")),
    ("engines", ("datakit.stages", "datakit.pipeline", "datakit.indexing", "datakit.cli")),
    ("engines/spark*", ("datakit.engines.local",)),
    ("io", ("datakit.stages", "datakit.engines", "datakit.pipeline", "datakit.indexing", "datakit.cli")),
    ("accounting", ("datakit.stages", "datakit.engines", "datakit.pipeline", "datakit.cli")),
]

# ... and the modules that import nothing of ours but what is listed (their own package included)
ONLY = [
    ("plan", ()),
    ("resources", ()),
    ("contracts", ("datakit.resources",)),
    ("synth", ("datakit.synth", "datakit.contracts")),
]


def _files(sub: str) -> list[Path]:
    if sub.endswith("*"):
        return sorted(PKG.glob(sub + ".py"))
    return _modules(sub)


@pytest.mark.parametrize("sub,forbidden", RULES, ids=[r[0] for r in RULES])
def test_import_rules_hold(sub, forbidden):
    files = _files(sub)
    assert files and all(f.exists() for f in files), f"datakit/{sub} is gone: update the rules and the docs"
    found = {f"{f.relative_to(PKG.parent)} imports {name}" for f in files for name in sorted(_imports(f))
             if any(_under(name, p) for p in forbidden)}
    assert not found, "\n".join(sorted(found))


@pytest.mark.parametrize("sub,allowed", ONLY, ids=[r[0] for r in ONLY])
def test_modules_that_import_nothing_else_of_ours(sub, allowed):
    """Found in a docs review: the doc said `contracts.py` imports nothing of ours (it imports
    `resources`) and `synth/` nothing but `contracts` (it imported extract's `doc_id`), and no rule
    here checked either; these are allow-lists, so `from datakit import x` counts too."""
    files = _files(sub)
    assert files and all(f.exists() for f in files), f"datakit/{sub} is gone: update the rules and the docs"
    found = {f"{f.relative_to(PKG.parent)} imports {name}" for f in files for name in sorted(_imports(f))
             if not any(_under(name, p) for p in allowed)}
    assert not found, "\n".join(sorted(found))


# the command-line layer: the CLI package and the console script's entry (datakit/launch.py), which must
# run before the CLI package is imported (it may restart the process), so it cannot live inside it
CLI_LAYER = ("datakit.cli", "datakit.launch")


def test_only_the_cli_imports_the_cli():
    bad = [f"{f.relative_to(PKG.parent)} imports {n}" for f in sorted(PKG.rglob("*.py"))
           if not any(_under(".".join(f.relative_to(PKG.parent).with_suffix("").parts), c) for c in CLI_LAYER)
           for n in _imports(f) if any(_under(n, c) for c in CLI_LAYER)]
    assert not bad, "\n".join(bad)


def test_stage_modules_are_named_by_their_kind():
    """`kind: scrub_pii` lives in datakit/stages/scrub_pii(.py|/): a newcomer finds a stage by its name."""
    from datakit.stages.base import BUILTIN_STAGE_MODULES

    for kind, module in BUILTIN_STAGE_MODULES.items():
        assert _under(module, f"datakit.stages.{kind}"), f"{kind} lives in {module}"


def test_the_import_walk_sees_lazy_and_relative_imports(tmp_path):
    f = tmp_path / "probe.py"
    f.write_text("def f():\n    from datakit.engines import core\n    from ..io import sinks\n    from . import base\n"
                 "import datakit.cli\nimport datakitten\n")
    assert _imports(f, "datakit.stages.probe") == {
        "datakit.engines", "datakit.engines.core", "datakit.io", "datakit.io.sinks", "datakit.stages",
        "datakit.stages.base", "datakit.cli"}
