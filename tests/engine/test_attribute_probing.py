"""The engine's parts are handed over, not probed: few getattr/hasattr, none on its parts.

A part the trainer was built with is an attribute it has; probing for one
(``getattr(trainer, "x", None)``, ``hasattr(loader, ...)``, ``except AttributeError``) stands
in for wiring that should be explicit. Counted on the source, so a new probe fails here.
"""

import ast
import pathlib

import trainkit.engine

ENGINE = pathlib.Path(trainkit.engine.__file__).parent
# What a probe must not be on: the loop, the step, the loader, the hooks and listeners.
PARTS = ("trainer", "step", "loader", "hook", "listener", "self")


def _probes(tree: ast.AST, source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr"):
                found.append((node.lineno, ast.get_source_segment(source, node)))
            elif (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "vars"
            ):
                found.append((node.lineno, ast.get_source_segment(source, node)))
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and isinstance(node.comparators[0], ast.Call)
            and isinstance(node.comparators[0].func, ast.Name)
            and node.comparators[0].func.id == "vars"
        ):  # "name" in vars(obj): a probe for an attribute set or not
            found.append((node.lineno, ast.get_source_segment(source, node)))
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
            if any(isinstance(n, ast.Name) and n.id == "AttributeError" for n in names):
                found.append((node.lineno, "except AttributeError"))
    return found


def _all_probes() -> dict[str, list[tuple[int, str]]]:
    probes = {}
    for path in sorted(ENGINE.rglob("*.py")):
        source = path.read_text()
        found = _probes(ast.parse(source), source)
        if found:
            probes[str(path.relative_to(ENGINE))] = found
    return probes


def test_the_engine_probes_at_most_ten_attributes_and_none_of_its_parts():
    probes = _all_probes()
    total = sum(len(found) for found in probes.values())
    assert total <= 10, probes
    on_parts = {
        path: [(line, text) for line, text in found if text.startswith(("getattr(", "hasattr("))
               and any(part in text.split(",")[0] for part in PARTS)]
        for path, found in probes.items()
    }  # fmt: skip
    in_vars = {path: [t for _, t in found if " in vars(" in t] for path, found in probes.items()}
    assert not any(in_vars.values()), in_vars
    assert not any(on_parts.values()), on_parts


def test_the_counter_finds_each_kind_of_probe():
    source = (
        "getattr(trainer, 'model', None)\nhasattr(loader, 'x')\nvars(step).get('y')\n"
        "try:\n    pass\nexcept (KeyError, AttributeError):\n    pass\n'cfg' in vars(self)\n"
    )
    assert [line for line, _ in _probes(ast.parse(source), source)] == [1, 2, 3, 6, 8]
