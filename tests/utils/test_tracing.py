"""trainkit.utils.tracing: is_fx_tracing sees a torch.fx trace; assert_fx_safe steps aside in it."""

import pytest
import torch
import torch.fx

from trainkit.utils.tracing import assert_fx_safe, is_fx_tracing


class _Checked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(is_fx_tracing())
        # a Proxy's shape cannot be compared while tracing: the check must not run then
        assert_fx_safe(x.shape[0] > 0, "empty batch")
        return x * 2


def test_is_fx_tracing_only_during_a_symbolic_trace():
    module = _Checked()
    module(torch.ones(2))
    traced = torch.fx.symbolic_trace(module)
    assert module.seen == [False, True]
    assert not is_fx_tracing()  # restored after the trace
    assert torch.equal(traced(torch.ones(3)), torch.full((3,), 2.0))


def test_is_fx_tracing_is_false_in_eager_mode():
    module = _Checked()
    module(torch.ones(1))
    assert module.seen == [False]


def test_assert_fx_safe_raises_in_eager_mode():
    assert_fx_safe(True, "fine")
    assert_fx_safe(torch.tensor(True), "fine")
    with pytest.raises(AssertionError, match="^empty batch$"):
        _Checked()(torch.ones(0))
