"""trainkit's Registry: user-facing lookup errors, remove(), and only fvcore's public API."""

import pytest
from fvcore.common.registry import Registry as FvcoreRegistry

from trainkit.utils import UsageError
from trainkit.utils.errors import UnknownNameError
from trainkit.utils.registry import Registry


def _registry_with(*names):
    registry = Registry("WIDGET")
    for name in names:
        registry.register(type(name, (), {}))
    return registry


def test_unknown_name_is_a_usage_error_and_a_key_error_naming_it():
    registry = _registry_with("Blue", "Green")
    with pytest.raises(UnknownNameError) as info:
        registry.get("Bleu")
    error = info.value
    assert isinstance(error, UsageError) and isinstance(error, KeyError)
    message = str(error)
    assert "\n" not in message and message == error.args[0]  # one line, not KeyError's quoting
    assert "'Bleu'" in message and "WIDGET" in message
    assert "Did you mean Blue?" in message and "Registered: Blue, Green" in message


def test_message_names_the_config_key_when_given():
    message = _registry_with("Blue").unknown_name_message("Red", key="MODEL.WIDGET")
    assert message.startswith("MODEL.WIDGET 'Red' is not registered")
    assert "Fix MODEL.WIDGET" in message


def test_remove_forgets_a_name_so_it_can_be_registered_again():
    registry = _registry_with("Blue", "Green")
    first = registry.get("Blue")
    assert registry.remove("Blue") is first
    assert "Blue" not in registry and [name for name, _ in registry] == ["Green"]
    with pytest.raises(UnknownNameError, match="'Blue'"):
        registry.get("Blue")
    with pytest.raises(UnknownNameError, match="'Blue'"):
        registry.remove("Blue")

    @registry.register()
    class Blue:  # a new class under the old name
        pass

    assert registry.get("Blue") is Blue is not first


def test_registering_a_name_twice_is_refused_with_both_names():
    registry = _registry_with("Blue")
    with pytest.raises(ValueError, match=r"'Blue' is already registered in the WIDGET registry"):
        registry.register(type("Blue", (), {}))


def test_public_behaviour_of_fvcores_registry_is_kept():
    registry = Registry("WIDGET")
    assert isinstance(registry, FvcoreRegistry)

    @registry.register()
    def make():
        return 1

    class Thing:
        pass

    assert registry.register(Thing) is None  # fvcore's function form returns nothing
    assert "make" in registry and "Thing" in registry and "other" not in registry
    assert dict(registry) == {"make": make, "Thing": Thing}  # iteration: (name, obj) pairs
    assert "WIDGET" in repr(registry) and "Thing" in str(registry)


def test_fvcores_private_attributes_are_never_read():
    registry = _registry_with("Blue")
    # If fvcore renamed or dropped its internals, nothing here may break.
    for private in ("_obj_map", "_name"):
        if hasattr(registry, private):
            delattr(registry, private)
    assert registry.get("Blue").__name__ == "Blue"
    assert "Blue" in registry and [name for name, _ in registry] == ["Blue"]
    with pytest.raises(UnknownNameError, match="WIDGET"):
        registry.get("Red")
    assert registry.name == "WIDGET" and "Blue" in repr(registry)
