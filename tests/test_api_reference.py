"""The docs build with Sphinx, warnings as errors, and the API reference is complete.

``docs/conf.py`` builds README.md, docs/*.md (myst-parser) and the API reference
(``docs/api/*.rst``: autodoc, napoleon for the Google-style docstrings) from the repository
root. With ``-W`` a docstring that is not valid reStructuredText, a page outside the toctree
or a link to a missing page or heading fails the build, with its file and line.

The reference is generated, so it cannot name something that does not exist; what is
checked instead is that it leaves nothing out: every name in the ``__all__`` of a module a
page documents is in the built reference, and every package of trainkit is on a page.

The whole build takes about 15 s on 2 cores (`docs/conf.py` says how to run it by hand).
"""

import importlib
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API_PAGES = ROOT / "docs" / "api"
AUTOMODULE = re.compile(r"^\.\. automodule:: (\S+)\s*$", flags=re.MULTILINE)

# Packages deliberately without a page, each with the reason. Empty today.
_PLACEHOLDERS = "detectron2's detection-only paths: placeholders that explain themselves"
NOT_DOCUMENTED: dict[str, str] = {
    "trainkit.export": _PLACEHOLDERS,
    "trainkit.modeling.proposal_generator": _PLACEHOLDERS,
    "trainkit.modeling.roi_heads": _PLACEHOLDERS,
    "trainkit.projects": _PLACEHOLDERS,
    "trainkit.tracking": _PLACEHOLDERS,
    # The data package's stages: their public names are trainkit.data's (documented there).
    "trainkit.data.loading": "a stage of trainkit.data, which exports its public names",
    "trainkit.data.mapping": "a stage of trainkit.data, which exports its public names",
    "trainkit.data.plans": "a stage of trainkit.data, which exports its public names",
    "trainkit.data.records": "a stage of trainkit.data, which exports its public names",
}


def build(source: Path, out: Path, pythonpath: Path | None = None) -> str:
    """Build ``source`` with docs/conf.py into ``out``; return the warnings, "" if none."""
    env = None
    if pythonpath is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), str(ROOT)])}
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
        + ["-c", str(ROOT / "docs"), str(source), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0 or result.stderr, result.stdout
    return result.stderr if result.returncode else ""


def documented(out: Path) -> set[str]:
    """Return the names of the objects the built pages describe (their ``objects.inv``)."""
    data = (out / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):  # "# Sphinx inventory version 2", project, version, compression note
        header_end = data.index(b"\n", header_end) + 1
    lines = zlib.decompress(data[header_end:]).decode().splitlines()
    return {line.split(" ", 1)[0] for line in lines}


def documented_modules() -> list[str]:
    return [
        name
        for page in sorted(API_PAGES.glob("*.rst"))
        for name in AUTOMODULE.findall(page.read_text())
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[str, set[str]]:
    out = tmp_path_factory.mktemp("docs")
    warnings = build(ROOT, out)
    return warnings, documented(out) if (out / "objects.inv").exists() else set()


def test_the_docs_build_without_warnings(reference):
    warnings, _ = reference
    assert not warnings, f"the docs build with warnings (here as errors):\n{warnings}"


def test_every_name_in_a_documented_all_is_in_the_reference(reference):
    _, names = reference
    missing = []
    for module_name in documented_modules():
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if not isinstance(getattr(module, name, None), type(sys)):  # a submodule: own entry
                if f"{module_name}.{name}" not in names:
                    missing.append(f"{module_name}.{name}")
    assert not missing, "in __all__ but not in the API reference: " + ", ".join(missing)


def test_every_package_is_on_a_page():
    pages = set(documented_modules())
    packages = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "trainkit").rglob("__init__.py")
    } - {"trainkit"}
    missing = sorted(p for p in packages - pages - set(NOT_DOCUMENTED) if "._" not in p)
    assert not missing, (
        f"packages on no page of docs/api/: {missing}; add `.. automodule:: NAME` to the page "
        "of the package above it (or to NOT_DOCUMENTED here, with the reason)"
    )


# A one-module project built with the same docs/conf.py: the build fails on a docstring that
# is not valid reStructuredText, naming the object, and passes once it is.
DOCSTRING = '''"""A module for the docs test."""

__all__ = ["scale"]


def scale(x: float) -> float:
    """Return ``x`` doubled.

    Args:
        x: the value, {text}.
    """
    return 2 * x
'''


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("``valid``", None),
        ("``never closed", "Inline literal start-string without end-string"),
    ],
)
def test_a_docstring_that_is_not_valid_rst_fails_the_build(tmp_path, text, error):
    (tmp_path / "docs_test_module.py").write_text(DOCSTRING.format(text=text))
    source = tmp_path / "source"
    (source / "docs").mkdir(parents=True)
    (source / "docs" / "index.rst").write_text("Test\n====\n\n.. automodule:: docs_test_module\n")
    warnings = build(source, tmp_path / "out", pythonpath=tmp_path)
    if error is None:
        assert not warnings
        assert "docs_test_module.scale" in documented(tmp_path / "out")
    else:
        assert error in warnings
        assert "docs_test_module.scale" in warnings
