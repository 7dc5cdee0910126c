"""Packages import only from the layers below (utils <- config <- middle <- launcher <- engine)."""

import ast
from pathlib import Path

import trainkit

# package -> trainkit packages it may import (besides itself)
ALLOWED = {
    "utils": set(),
    "config": {"utils"},
    "data": {"utils", "config"},
    "solver": {"utils", "config"},
    "checkpoint": {"utils", "config"},
    "modeling": {"utils", "config"},
    "evaluation": {"utils", "config"},
    "launcher": {"utils", "config", "data", "solver", "checkpoint", "modeling", "evaluation"},
    "engine": {
        "utils",
        "config",
        "data",
        "solver",
        "checkpoint",
        "modeling",
        "evaluation",
        "launcher",
    },
}


def _trainkit_imports(source: str) -> set:
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide the layer; use absolute imports"
            if node.module == "trainkit":
                names = ["trainkit." + alias.name for alias in node.names]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "trainkit" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_packages_import_only_lower_layers():
    root = Path(trainkit.__file__).parent
    violations = []
    for path in sorted(root.rglob("*.py")):
        package = path.relative_to(root).parts[0]
        if package not in ALLOWED:
            continue
        imported = _trainkit_imports(path.read_text()) - {package}
        violations += [
            f"{path.relative_to(root)} imports trainkit.{bad}"
            for bad in sorted(imported - ALLOWED[package])
        ]
    assert not violations, "\n".join(violations)


def test_checker_catches_a_violation():
    assert _trainkit_imports("from trainkit import engine\nimport trainkit.data.build") == {
        "engine",
        "data",
    }
