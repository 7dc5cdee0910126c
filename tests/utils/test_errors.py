"""utils.errors.add_note: a note reaches ``__notes__`` on every Python setup.py allows."""

import sys

import pytest

from trainkit.utils.errors import add_note


@pytest.mark.parametrize("version", [sys.version_info, (3, 9, 18)])
def test_notes_are_kept_in_order_also_without_add_note(monkeypatch, version):
    monkeypatch.setattr(sys, "version_info", version)
    error = ValueError("bad value")
    add_note(error, "first")
    add_note(error, "second")
    assert error.__notes__ == ["first", "second"]
    assert str(error) == "bad value"
