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


def _imports(path: Path) -> set[str]:
    """Every `datakit...` module a file imports, at any depth (lazy imports count too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("datakit")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("datakit"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _modules(sub: str) -> list[Path]:
    root = PKG / sub
    return sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# (which files, which imports they must not have)
RULES = [
    ("stages", ("datakit.engines", "datakit.pipeline", "datakit.indexing", "datakit.cli")),
    ("engines", ("datakit.stages", "datakit.pipeline", "datakit.indexing", "datakit.cli")),
    ("io", ("datakit.stages", "datakit.engines", "datakit.pipeline", "datakit.indexing", "datakit.cli")),
    ("plan", ("datakit.stages", "datakit.engines", "datakit.pipeline", "datakit.cli", "datakit.io")),
    ("contracts", ("datakit.stages", "datakit.engines", "datakit.pipeline", "datakit.cli", "datakit.io")),
    ("accounting", ("datakit.stages", "datakit.engines", "datakit.pipeline", "datakit.cli")),
]


@pytest.mark.parametrize("sub,forbidden", RULES, ids=[r[0] for r in RULES])
def test_import_rules_hold(sub, forbidden):
    files = _modules(sub)
    assert files and all(f.exists() for f in files), f"datakit/{sub} is gone: update the rules and the docs"
    found = {f"{f.relative_to(PKG.parent)} imports {name}" for f in files for name in sorted(_imports(f))
             if any(_under(name, p) for p in forbidden)}
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
