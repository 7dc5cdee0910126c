import pickle

from trainkit.utils.serialize import PicklableWrapper


def make_adder(n):
    def add(x):  # a local function: plain pickle refuses it
        return x + n

    return add


def test_lambdas_and_closures_survive_pickle():
    for func, expected in [(lambda x: x * 3, 6), (make_adder(5), 7)]:
        wrapped = pickle.loads(pickle.dumps(PicklableWrapper(func)))
        assert isinstance(wrapped, PicklableWrapper) and wrapped(2) == expected


def test_wrapper_reads_through_and_does_not_nest():
    class Mapper:
        scale = 4

        def __call__(self, x):
            return x * self.scale

    wrapped = PicklableWrapper(PicklableWrapper(Mapper()))
    assert isinstance(wrapped.wrapped, Mapper)
    assert wrapped.scale == 4 and wrapped(2) == 8
    assert "Mapper" in repr(wrapped)
    assert pickle.loads(pickle.dumps(wrapped))(3) == 12
