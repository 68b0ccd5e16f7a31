"""Property tests: for every metric type, merge is associative, empty() is a two-sided
identity, and merging K pieces equals one from_model_output over the concatenated data."""

import functools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from metrics_manager.metrics import (
    AveragePerStep,
    Max,
    MeanStd,
    Min,
    Step,
    StepsPerTime,
    Sum,
    Time,
    TimeRate,
)

PIECE = 4  # elements per piece: fixed, so eager ops compile once per number of pieces


def _from_data(cls, values, mask):
    """One metric of `cls` from a piece of data (values, mask) in the type's own terms."""
    if cls in (Step, StepsPerTime):
        return cls.from_model_output(steps=np.int32(len(values) // PIECE))
    if cls is Time:
        return cls.from_model_output()
    if cls is AveragePerStep:  # each piece is one step: the concatenation is K steps
        return cls.from_model_output(values, mask=mask, steps=np.int32(len(values) // PIECE))
    if cls is TimeRate:
        return cls.from_model_output(np.where(mask, values, 0))
    return cls.from_model_output(values, mask=mask)


ALL_TYPES = [Sum, Step, AveragePerStep, Time, TimeRate, StepsPerTime, Max, Min, MeanStd]

pieces = st.lists(
    st.tuples(
        hnp.arrays(np.float32, PIECE, elements=st.floats(-100, 100, width=32)),
        hnp.arrays(np.bool_, PIECE),
    ),
    min_size=1,
    max_size=4,
)

property_settings = settings(max_examples=15, deadline=None, derandomize=True)


def _assert_same(a, b, rtol=1e-5, atol=1e-3):
    assert type(a) is type(b)
    leaves_a, tree_a = jax.tree.flatten(a)
    leaves_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@property_settings
@given(data=pieces)
def test_merge_is_associative(cls, data):
    while len(data) < 3:
        data = data + data
    a, b, c = (_from_data(cls, v, m) for v, m in data[:3])
    _assert_same(a.merge(b).merge(c), a.merge(b.merge(c)))


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@property_settings
@given(data=pieces)
def test_empty_is_a_two_sided_identity(cls, data):
    metric = functools.reduce(lambda x, y: x.merge(y), (_from_data(cls, v, m) for v, m in data))
    # Exact: an identity must not perturb a single bit.
    _assert_same(cls.empty().merge(metric), metric, rtol=0, atol=0)
    _assert_same(metric.merge(cls.empty()), metric, rtol=0, atol=0)
    _assert_same(cls.empty().merge(cls.empty()), cls.empty(), rtol=0, atol=0)


@pytest.mark.parametrize("cls", [Sum, Max, Min, MeanStd], ids=lambda c: c.__name__)
def test_empty_keeps_an_infinite_value_on_either_side(cls):
    # The data above are finite: a merge that computed `mean + (0 - mean) * 0` for an empty
    # side passed, though it makes an infinite mean NaN.
    metric = cls.from_model_output(np.full(2, np.inf, np.float32))
    assert float(metric.compute()) == np.inf
    for merged in (cls.empty().merge(metric), metric.merge(cls.empty())):
        assert float(merged.compute()) == np.inf
        _assert_same(merged, metric, rtol=0, atol=0)


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@property_settings
@given(data=pieces)
def test_merging_pieces_equals_one_metric_of_the_concatenation(cls, data):
    merged = functools.reduce(lambda x, y: x.merge(y), (_from_data(cls, v, m) for v, m in data))
    values = np.concatenate([v for v, _ in data])
    mask = np.concatenate([m for _, m in data])
    whole = _from_data(cls, values, mask)
    if cls is MeanStd:
        # Merged in another order, the mean and deviation (up to 100) differ by rounding.
        np.testing.assert_allclose(merged.count, whole.count)
        np.testing.assert_allclose(merged.mean, whole.mean, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(merged.std_dev, whole.std_dev, rtol=1e-4, atol=1e-3)
    else:
        _assert_same(merged, whole)
