"""Every ``trainkit.X.Y`` that README.md and docs/*.md name exists.

A name resolves when its longest importable module prefix imports and the rest of it is
found by ``getattr`` (a class attribute, a method, or a name the class annotates for its
instances). A name that does not resolve fails the test with its file and line. The API
reference (docs/api/) is generated from the code, so it names nothing that is missing;
``tests/test_api_reference.py`` builds it and checks that it leaves nothing out.

The pages link each other; every relative link must reach a file, and its ``#anchor`` a
heading of that file.
"""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"\btrainkit(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def named_in(path: Path) -> list[tuple[int, str]]:
    """Return ``(line number, name)`` for every trainkit name the page gives."""
    return [
        (number, match.group())
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for match in NAME.finditer(line)
    ]


def _import_longest_prefix(parts: list[str]) -> tuple[object, list[str]]:
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            return importlib.import_module(module_name), parts[end:]
        except ModuleNotFoundError as error:
            # Only "this prefix is not a module" moves on; a module that fails to import
            # because of something it imports is an error of its own.
            if error.name is None or not module_name.startswith(error.name):
                raise
    raise AssertionError(f"{parts[0]} does not import")


def _annotated(obj: object, attribute: str) -> bool:
    """True if ``obj`` is a class whose MRO annotates ``attribute`` (an instance attribute)."""
    return isinstance(obj, type) and any(
        attribute in vars(klass).get("__annotations__", {}) for klass in obj.__mro__
    )


def resolve(name: str) -> str | None:
    """Return None if ``name`` resolves, else what is missing."""
    obj, rest = _import_longest_prefix(name.split("."))
    for attribute in rest:
        if hasattr(obj, attribute):
            obj = getattr(obj, attribute)
        elif _annotated(obj, attribute):
            return None  # an instance attribute: nothing further to follow
        else:
            return f"{getattr(obj, '__name__', obj)!s} has no attribute {attribute!r}"
    return None


def test_the_pattern_finds_names_and_stops_at_punctuation(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See `trainkit.solver.build_optimizer(cfg, model)` and trainkit.engine.\n"
        "Also (trainkit.utils.comm.get_rank), not trainkit/engine/launch.py.\n"
    )
    assert named_in(page) == [
        (1, "trainkit.solver.build_optimizer"),
        (1, "trainkit.engine"),
        (2, "trainkit.utils.comm.get_rank"),
    ]


def test_resolve_reports_what_is_missing():
    assert resolve("trainkit.engine.hooks.PeriodicWriter") is None
    assert resolve("trainkit.config.CfgNode.merge_from_list") is None
    assert "no attribute 'no_such_name'" in resolve("trainkit.utils.comm.no_such_name")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_trainkit_name_in_the_docs_resolves(page):
    unresolved = []
    for number, name in named_in(page):
        problem = resolve(name)
        if problem is not None:
            unresolved.append(f"{page.relative_to(ROOT)}:{number}: {name}: {problem}")
    assert not unresolved, "\n".join(unresolved)


LINK = re.compile(r"\]\(([^)\s]+)\)")


def heading_anchors(path: Path) -> set[str]:
    """Return the anchors GitHub gives the headings of a Markdown page."""
    anchors, in_code = set(), False
    for line in path.read_text().splitlines():
        in_code ^= line.startswith("```")
        if not in_code and (heading := re.match(r"#+ (.*)", line)):
            text = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = []
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        for link in LINK.findall(line):
            if link.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = link.partition("#")
            target = (page.parent / file).resolve() if file else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}:{number}: {link}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in heading_anchors(target):
                broken.append(f"{page.relative_to(ROOT)}:{number}: {link}: no such heading")
    assert not broken, "\n".join(broken)


# `dir/test_file.py` or `dir/test_file.py::test_name` (a trailing * matches a prefix), as the
# fault table of docs/troubleshooting.md cites its tests; paths are relative to tests/.
# `detectron2/...` paths are detectron2's own tests, not checked here.
TEST_REFERENCE = re.compile(r"`((?:\w+/)*test_\w+\.py)(?:::(\w+\*?))?`")


def cited_tests(path: Path) -> list[tuple[int, str, str | None]]:
    return [
        (number, match.group(1), match.group(2))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        for match in TEST_REFERENCE.finditer(line)
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_test_the_docs_cite_exists(page):
    missing = []
    for number, file, name in cited_tests(page):
        if file.startswith("detectron2/"):
            continue
        path = ROOT / "tests" / file
        if not path.is_file():
            path = ROOT / file  # written from the repository root
        if not path.is_file():
            missing.append(f"{page.relative_to(ROOT)}:{number}: {file}: no such test file")
            continue
        defined = re.findall(r"^def (test_\w+)", path.read_text(), flags=re.MULTILINE)
        prefix = (name or "").rstrip("*")
        found = any(
            t.startswith(prefix) if name and name.endswith("*") else t == name for t in defined
        )
        if name and not found:
            missing.append(f"{page.relative_to(ROOT)}:{number}: {file}::{name}: no such test")
    assert not missing, "\n".join(missing)
