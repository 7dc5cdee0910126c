"""The launcher uses torch.distributed.elastic through its public API only."""

import importlib
import inspect
import pkgutil

import trainkit


def _trainkit_classes():
    for info in pkgutil.walk_packages(trainkit.__path__, "trainkit."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                yield cls


def _is_method(value):
    return callable(value) or isinstance(value, (property, staticmethod, classmethod))


def _private_overrides(cls, package="torch.distributed"):
    """``cls``'s own methods that replace a ``_private`` one of a base class from ``package``."""
    own = {
        name
        for name, value in vars(cls).items()
        if name.startswith("_") and not name.startswith("__") and _is_method(value)
    }
    return [
        f"{cls.__module__}.{cls.__qualname__}.{name} overrides "
        f"{base.__module__}.{base.__qualname__}.{name}"
        for base in cls.__mro__[1:]
        if base.__module__.startswith(package + ".")
        for name in sorted(own & set(vars(base)))
    ]


def test_no_private_method_of_torch_distributed_is_overridden():
    # A private method changes with any torch refactor (the old agent overrode
    # LocalElasticAgent._monitor_workers); public interfaces such as RendezvousHandler's
    # methods may be implemented.
    found = [line for cls in _trainkit_classes() for line in _private_overrides(cls)]
    assert not found, "\n".join(found)


def test_the_check_sees_an_override():
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class Agent(LocalElasticAgent):
        def _monitor_workers(self, worker_group):
            return super()._monitor_workers(worker_group)

    assert _private_overrides(Agent) == [
        f"{__name__}.test_the_check_sees_an_override.<locals>.Agent._monitor_workers overrides "
        "torch.distributed.elastic.agent.server.local_elastic_agent."
        "LocalElasticAgent._monitor_workers",
        f"{__name__}.test_the_check_sees_an_override.<locals>.Agent._monitor_workers overrides "
        "torch.distributed.elastic.agent.server.api.SimpleElasticAgent._monitor_workers",
    ]
