"""Metric types: T5X's numeric cases, compute() formulas, identities and host-side functions."""

import doctest
import functools
import math

import clu.metrics as clu_metrics
import clu.values
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from metrics_manager import metrics as mm
from metrics_manager.metrics import (
    AveragePerStep,
    Max,
    MeanStd,
    MeanStdScalar,
    Min,
    Step,
    StepsPerTime,
    Sum,
    Time,
    TimeRate,
)


def test_docstring_examples_run():
    result = doctest.testmod(mm, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10
    assert result.failed == 0


# --- T5X's numeric cases (REFERENCE section 1) ---------------------------------------------


def test_t5x_sum():
    assert float(Sum.from_model_output(jnp.array([[1, 2], [2, 3], [3, 4]])).compute()) == 15.0


def test_t5x_time_rate():
    metrics = mm.set_time_metrics_duration({"rate": TimeRate.from_model_output(3)}, 2.0)
    assert float(metrics["rate"].compute()) == 1.5


def test_t5x_steps_per_time():
    metrics = mm.set_time_metrics_duration({"sps": StepsPerTime(steps=8)}, 2)
    metrics = mm.set_step_metrics_num_steps(metrics, 8)
    assert metrics["sps"].compute() == 4.0
    # A duration of 0 (allowed) gives what TimeRate's division gives: inf, NaN for 0 steps.
    zero = mm.set_time_metrics_duration(
        {"a": StepsPerTime(steps=8), "b": StepsPerTime(steps=0)}, 0.0
    )
    assert zero["a"].compute() == math.inf and math.isnan(zero["b"].compute())


@pytest.mark.parametrize("number", [int, float, np.float32, np.float64])
def test_a_zero_denominator_of_host_numbers_gives_inf_or_nan_not_an_error(number):
    # TimeRate and AveragePerStep divided Python numbers: a 0 s window or 0 steps raised
    # ZeroDivisionError on the host (NumPy numbers: a RuntimeWarning), where arrays give inf.
    rates = mm.set_time_metrics_duration(
        {
            "up": TimeRate(numerator=number(3)),
            "down": TimeRate(numerator=number(-3)),
            "none": TimeRate(numerator=number(0)),
        },
        number(0),
    )
    assert [rates[k].compute() for k in ("up", "down")] == [math.inf, -math.inf]
    assert math.isnan(rates["none"].compute())
    assert AveragePerStep(total=number(6), steps=0).compute() == math.inf
    assert math.isnan(AveragePerStep(total=number(0), steps=0).compute())
    assert AveragePerStep(total=number(6), steps=3).compute() == 2.0
    assert rates["up"].replace(duration=number(2)).compute() == 1.5


def test_t5x_average_per_step():
    metric = AveragePerStep.from_model_output(jnp.array([1.0, 2.0, 3.0]))
    metrics = mm.set_step_metrics_num_steps({"avg": metric}, 5)
    np.testing.assert_allclose(metrics["avg"].compute(), 6.0 / 5)


def test_t5x_manager_summary_numbers():
    # T5X's MetricsManager test: a 40 s window, num_steps 2.
    metrics = {
        "loss": Sum(40.0),
        "accuracy": AveragePerStep(total=20.0),
        "steps_per_second": StepsPerTime(),
    }
    metrics = mm.set_time_metrics_duration(metrics, 40.0)
    metrics = mm.set_step_metrics_num_steps(metrics, 2)
    assert metrics["loss"].compute() == 40.0
    assert metrics["accuracy"].compute() == 10.0
    assert metrics["steps_per_second"].compute() == 0.05


def test_alias_is_same_function():
    assert mm.set_time_rate_metrics_duration is mm.set_time_metrics_duration


def test_setters_take_a_collection_or_one_metric_as_t5x_tree_map_does():
    # T5X's setters map over any pytree; a CLU Collection (what T5X's MetricsManager is typed
    # to take) or a single metric raised "expects a mapping from names to metrics".
    Window = clu_metrics.Collection.create(  # noqa: N806  (a class)
        loss=AveragePerStep, steps_per_second=StepsPerTime, seqs_per_second=TimeRate
    )
    step = Window.single_from_model_output(values=jnp.array([2.0, 4.0]), numerator=8.0)
    window = step.merge(step)  # two steps of 8 sequences, loss 6 each
    window = mm.set_time_metrics_duration(mm.set_step_metrics_num_steps(window, 2), 4.0)
    assert type(window) is Window
    assert {k: float(v) for k, v in window.compute().items()} == {
        "loss": 6.0,  # 12 / 2 steps
        "steps_per_second": 0.5,  # 2 steps / 4 s
        "seqs_per_second": 4.0,  # 16 / 4 s
    }
    rate = mm.set_time_metrics_duration(TimeRate(numerator=3.0), 2.0)
    assert mm.set_step_metrics_num_steps(AveragePerStep(total=6.0), 4).compute() == 1.5
    assert rate.compute() == 1.5
    # A list was refused as "expects a mapping from names to metrics", naming neither.
    for setter, arg in ((mm.set_step_metrics_num_steps, 4), (mm.set_time_metrics_duration, 2.0)):
        with pytest.raises(TypeError) as err:
            setter([AveragePerStep(total=6.0)], arg)
        assert str(err.value) == (
            f"{setter.__name__} expects a mapping from names to metrics (or what merge_metrics "
            "returns), one CLU metric or a CLU Collection, got list."
        )


def test_t5x_create_metrics_dict_makes_sums_that_merge_over_a_window():
    # T5X's name (its models' compute_metrics) raised AttributeError here.
    from metrics_manager import create_metrics_dict

    step = {"loss": jnp.float32(2.5), "num_tokens": 7, "num_examples": np.int32(2)}
    first, second = create_metrics_dict(step), create_metrics_dict(step)
    assert all(type(metric) is Sum for metric in first.values())
    merged = {key: first[key].merge(second[key]) for key in first}
    assert {key: float(metric.compute()) for key, metric in merged.items()} == {
        "loss": 5.0,
        "num_tokens": 14.0,
        "num_examples": 4.0,
    }


# --- compute() formulas on hand-worked inputs --------------------------------------------


def test_sum_with_mask_and_int_input_accumulates_in_float32():
    metric = Sum.from_model_output(jnp.array([[1, 2], [3, 4]], jnp.int32), mask=jnp.array([1, 0]))
    assert metric.total.dtype == jnp.float32
    assert float(metric.compute()) == 3.0


def test_integer_sums_are_float64_and_exact_past_2_24_under_x64():
    """A token count of a long window under jax_enable_x64: float32 would round it."""
    with jax.enable_x64(True):
        tokens = jnp.array([2**40 + 1, 1], jnp.int64)
        window = jax.jit(lambda a, b: a.merge(b))(Sum.empty(), Sum.from_model_output(tokens))
        assert window.total.dtype == jnp.float64 and int(window.compute()) == 2**40 + 2
        assert Max.from_model_output(jnp.array([2**30 + 1])).value.dtype == jnp.float64
        # Floats keep their precision: float32 stays float32, bfloat16 widens to float32.
        assert Sum.from_model_output(jnp.float32(1.0)).total.dtype == jnp.float32
        assert Sum.from_model_output(jnp.bfloat16(1.0)).total.dtype == jnp.float32
    assert Sum.from_model_output(jnp.int32(7)).total.dtype == jnp.float32  # without x64


@pytest.mark.parametrize("x64", [False, True])
def test_host_int64_values_past_2_31_do_not_wrap(x64):
    """Without x64, jnp.asarray made host int64 values int32 before the float cast: a count
    of 3e9 summed to -1294967296 in every value metric and NNX wrapper (a Python int raised
    OverflowError). Taken as floats on the host they match float64 NumPy: within float32's
    rounding without x64, float64's under it (NNX's Average keeps float32 there too)."""
    from metrics_manager import nnx as mnnx

    values = np.array([3_000_000_000, 1, 2**33 + 5], np.int64)
    reference = values.astype(np.float64)
    mean, std = reference.mean(), reference.std()
    with jax.enable_x64(x64):
        rtol = 1e-15 if x64 else 2**-23
        expected = {
            "sum": reference.sum(),
            "per_step": reference.sum(),
            "rate": reference.sum(),
            "max": reference.max(),
            "min": reference.min(),
            "mean": mean,
            "std": std,
            "welford_mean": mean,
            "welford_sem": std / np.sqrt(3),
            "python_int": 3e9,
            "numpy_scalar": 3e9,
        }
        welford = mm.Welford.from_model_output(values)
        got = {
            "sum": Sum.from_model_output(values).compute(),
            "per_step": AveragePerStep.from_model_output(values).total,
            "rate": TimeRate.from_model_output(values).numerator,
            "max": Max.from_model_output(values).compute(),
            "min": Min.from_model_output(values).compute(),
            "mean": MeanStd.from_model_output(values).compute(),
            "std": MeanStd.from_model_output(values).std(),
            "welford_mean": welford.compute(),
            "welford_sem": welford.sem(),
            "python_int": Sum.from_model_output(3_000_000_000).compute(),
            "numpy_scalar": Sum.from_model_output(np.int64(3_000_000_000)).compute(),
        }
        nnx_average, nnx_welford = mnnx.Average(), mnnx.Welford()
        nnx_average.update(values=values)
        nnx_welford.update(values=values)
        stats = nnx_welford.compute()
        nnx_got = {
            "average": nnx_average.compute(),
            "welford_mean": stats.mean,
            "welford_std": stats.standard_deviation,
        }
        nnx_expected = {"average": mean, "welford_mean": mean, "welford_std": std}
    assert {k: float(v) for k, v in got.items()} == pytest.approx(expected, rel=rtol)
    # NNX's Average takes float32 values under x64 too.
    assert {k: float(v) for k, v in nnx_got.items()} == pytest.approx(nnx_expected, rel=2**-23)


@pytest.mark.parametrize("x64", [False, True])
def test_host_ints_in_a_list_past_2_31_read_as_a_numpy_array_does(x64):
    """A list or tuple of host ints went to jnp.asarray as it was: without x64 one past 2**31
    raised OverflowError ('Python integer 3000000000 out of bounds for int32'), one past
    2**63 'Python int too large to convert to C long', also inside jit. They are floats on
    the host now, as an int64 NumPy array is; a list holding a JAX array is left to JAX."""
    from metrics_manager import nnx as mnnx

    with jax.enable_x64(x64):
        rtol = 1e-15 if x64 else 2**-23
        average = mnnx.Average()
        average.update(values=[3_000_000_000, 1])
        got = {
            "list": Sum.from_model_output([3_000_000_000]).compute(),
            "tuple": Sum.from_model_output((3_000_000_000, 1)).compute(),
            "nested": Sum.from_model_output([[3_000_000_000], [np.int64(2**33)]]).compute(),
            "past_2_64": Sum.from_model_output([2**70, 1]).compute(),
            "bools": Sum.from_model_output([True, True, False]).compute(),
            "masked": Sum.from_model_output([3_000_000_000, 7], mask=[True, False]).compute(),
            "max": Max.from_model_output([3_000_000_000, 1]).compute(),
            "mean": MeanStd.from_model_output([3_000_000_000, 1]).compute(),
            "per_step": AveragePerStep.from_model_output([3_000_000_000]).total,
            "in_jit": jax.jit(lambda: Sum.from_model_output([3_000_000_000]).compute())(),
            "with_a_jax_array": Sum.from_model_output([jnp.float32(1.5), 2]).compute(),
        }
        nnx_average = float(average.compute())  # float32 under x64 too, as Flax's
        dtypes = {Sum.from_model_output([3_000_000_000]).total.dtype}
    expected = {
        "list": 3e9,
        "tuple": 3e9 + 1,
        "nested": 3e9 + 2**33,
        "past_2_64": 2.0**70,
        "bools": 2.0,
        "masked": 3e9,
        "max": 3e9,
        "mean": (3e9 + 1) / 2,
        "per_step": 3e9,
        "in_jit": 3e9,
        "with_a_jax_array": 3.5,
    }
    assert {k: float(v) for k, v in got.items()} == pytest.approx(expected, rel=rtol)
    assert nnx_average == pytest.approx(1.5e9, rel=2**-23)
    assert dtypes == {np.dtype(np.float64 if x64 else np.float32)}
    with pytest.raises(TypeError, match=r"values must be an array or a number, got list \[\[1"):
        Sum.from_model_output([[1, 2], [3]])  # ragged: named as before


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_scan_carry_started_from_empty_traces_under_x64(dtype):
    """A window merged in `lax.scan` from `empty()`: the identities are float64 under x64,
    so the carry is float64 (a float32 zero failed to trace against float64 sums)."""
    from metrics_manager.classification import Perplexity

    xs = jnp.array([[1.0, -2.0], [4.0, 3.0], [0.5, 8.0]])
    kinds = {"sum": Sum, "avg": AveragePerStep, "rate": TimeRate, "max": Max, "min": Min}
    kinds |= {"std": MeanStd}

    def body(window, x):
        x = x.astype(dtype)
        new = {k: kind.from_model_output(x) for k, kind in kinds.items()}
        new["rate"] = TimeRate.from_model_output(numerator=x)
        new["ppl"] = Perplexity.from_model_output(jnp.stack([x, -x]), jnp.array([0, 1]))
        return {k: window[k].merge(new[k]) for k in window}, None

    with jax.enable_x64(True):
        empty = {k: kind.empty() for k, kind in kinds.items()} | {"ppl": Perplexity.empty()}
        window, _ = jax.lax.scan(body, empty, xs)
        assert window["sum"].total.dtype == window["std"].mean.dtype == jnp.float64
        values = xs.ravel()
        assert float(window["sum"].compute()) == float(values.sum()) == 14.5
        assert float(window["avg"].compute()) == pytest.approx(14.5 / 3)
        assert float(window["rate"].numerator) == 14.5
        assert (float(window["max"].compute()), float(window["min"].compute())) == (8.0, -2.0)
        assert float(window["std"].compute()) == pytest.approx(14.5 / 6)
        assert float(window["std"].std()) == pytest.approx(float(np.std(values, ddof=0)))
        # Each row's logits are `x` and `-x`; the targets pick x[0] and -x[1].
        rows = np.asarray(xs, np.float64)
        nll = [np.logaddexp(*r) - r[0] for r in rows] + [np.logaddexp(*-r) + r[1] for r in rows]
        assert float(window["ppl"].compute()) == pytest.approx(math.exp(np.mean(nll)), rel=1e-6)
    # Without x64 the identities are float32, as before, and strongly typed: a jitted step
    # started from empty() compiles once (weakly typed, it compiled again at step 2).
    assert Sum.empty().total.dtype == jnp.float32 and Max.empty().value.dtype == jnp.float32
    step = jax.jit(
        lambda window, x: {k: m.merge(type(m).from_model_output(x)) for k, m in window.items()}
    )
    window = {"sum": Sum.empty(), "max": Max.empty(), "std": MeanStd.empty()}
    for _ in range(3):
        window = step(window, jnp.ones(2))
    assert step._cache_size() == 1 and float(window["sum"].compute()) == 6.0


def test_average_per_step_merges_totals_and_steps():
    a = AveragePerStep.from_model_output(jnp.array([1.0, 2.0]))
    b = AveragePerStep.from_model_output(jnp.array([3.0, 6.0]))
    merged = a.merge(b)
    assert int(merged.steps) == 2
    assert float(merged.compute()) == (3.0 + 9.0) / 2


def test_step_counts_and_reduce_merge_keeps_one_step():
    assert Step().merge(Step()).merge(Step()).compute() == 3
    # Pieces of one batch (devices, microbatches) are one step.
    assert Step()._reduce_merge(Step()).compute() == 1
    avg = AveragePerStep(total=2.0)._reduce_merge(AveragePerStep(total=3.0))
    assert (avg.steps, avg.total) == (1, 5.0)


def test_time_rate_sums_array_numerators():
    merged = TimeRate.from_model_output(jnp.array([2, 3])).merge(TimeRate.from_model_output(5))
    metrics = mm.set_time_metrics_duration({"r": merged}, 4.0)
    assert float(metrics["r"].compute()) == 10.0 / 4.0


def test_time_reports_duration():
    merged = Time.from_model_output().merge(Time.empty())
    assert mm.set_time_metrics_duration({"t": merged}, 7.5)["t"].compute() == 7.5


def test_max_min_with_per_example_mask():
    values = jnp.array([[-5.0, -6.0], [-1.0, -2.0], [9.0, 9.0]])
    mask = jnp.array([1, 1, 0])  # the 9s are padding
    assert float(Max.from_model_output(values, mask=mask).compute()) == -1.0
    assert float(Min.from_model_output(values, mask=mask).compute()) == -6.0


def test_max_min_of_nothing_are_their_identities():
    values = jnp.array([1.0, 2.0])
    none = jnp.zeros(2, bool)
    assert float(Max.from_model_output(values, mask=none).compute()) == -np.inf
    assert float(Min.from_model_output(values, mask=none).compute()) == np.inf
    assert float(Max.empty().value) == -np.inf
    assert float(Min.empty().value) == np.inf


def test_mean_std_formula():
    values = np.array([[1.0, 4.0], [2.0, 8.0], [100.0, 100.0]], np.float32)
    mask = np.array([[1, 1], [1, 0], [0, 0]])
    metric = MeanStd.from_model_output(values, mask=mask)
    kept = np.array([1.0, 4.0, 2.0])
    assert int(metric.count) == 3
    np.testing.assert_allclose(metric.compute(), kept.mean(), rtol=1e-6)
    np.testing.assert_allclose(metric.std(), kept.std(), rtol=1e-6)
    value = metric.compute_value()
    assert isinstance(value, clu.values.Scalar) and isinstance(value, MeanStdScalar)
    np.testing.assert_allclose([value.value, value.std], [kept.mean(), kept.std()], rtol=1e-6)


def test_mean_std_empty_computes_nan():
    empty = MeanStd.empty()
    assert np.isnan(empty.compute()) and np.isnan(empty.std())


def test_mean_std_is_stable_when_mean_dwarfs_spread():
    # float32 sum of squares (clu's Std) loses everything here: 1e4**2 * 1e3 ~ 1e11, spread ~ 1.
    rng = np.random.default_rng(0)
    chunks = [(1e4 + rng.standard_normal(250)).astype(np.float32) for _ in range(4)]
    merged = MeanStd.from_model_output(chunks[0])
    for chunk in chunks[1:]:
        merged = merged.merge(MeanStd.from_model_output(chunk))
    full = np.concatenate(chunks).astype(np.float64)
    np.testing.assert_allclose(merged.std(), full.std(), rtol=1e-3)
    naive = np.sqrt(
        np.float32((full.astype(np.float32) ** 2).sum(dtype=np.float32) / full.size)
        - np.float32(full.mean()) ** 2
    )
    assert abs(naive - full.std()) > 1e-2 * full.std()  # what a sum-of-squares metric reports


def test_mean_std_of_float32_values_near_1e20_is_finite():
    """The float32 sum of squared deviations overflowed (3 values around 1e20: 1.3e41; 1000
    around 1e19: 1e41, past 3.4e38), and std() read inf where the deviation is a float32 number."""
    values = np.array([1e20, -1e20, 3e20], np.float32)
    three = MeanStd.from_model_output(values)
    reference = values.astype(np.float64)
    # population std: sqrt(((0)**2 + (2e20)**2 + (2e20)**2) / 3) = 2e20 * sqrt(2 / 3)
    assert float(three.std()) == pytest.approx(2e20 * np.sqrt(2 / 3), rel=1e-6)
    assert float(three.std()) == pytest.approx(reference.std(), rel=1e-6)
    assert float(three.compute()) == pytest.approx(reference.mean(), rel=1e-6)
    # 1000 values +-1e19 (mean 0), one batch and merged: std 1e19 (float32's 1e19 is 9.99999998e18).
    alternating = np.where(np.arange(1000) % 2 == 0, np.float32(1e19), np.float32(-1e19))
    one_batch = MeanStd.from_model_output(alternating)
    assert float(one_batch.std()) == pytest.approx(1e19, rel=1e-6)
    merged = functools.reduce(
        lambda a, b: a.merge(b),
        (MeanStd.from_model_output(c) for c in alternating.reshape(10, 100)),
    )
    assert float(merged.std()) == pytest.approx(1e19, rel=1e-6)
    # Two batches of one value each, 2e19 apart: the merge's delta**2 is 4e38.
    pair = MeanStd.from_model_output(np.float32([-1e19])).merge(
        MeanStd.from_model_output(np.float32([1e19]))
    )
    assert (float(pair.compute()), float(pair.std())) == (0.0, pytest.approx(1e19, rel=1e-6))
    # In range the deviation is unchanged: [1, 3] has std 1, [1, 2, 3, 4] sqrt(1.25).
    assert float(MeanStd.from_model_output(np.float32([1.0, 3.0])).std()) == 1.0
    both = MeanStd.from_model_output(np.float32([1, 2])).merge(
        MeanStd.from_model_output(np.float32([3, 4]))
    )
    assert float(both.std()) == pytest.approx(np.sqrt(1.25), rel=1e-7)


def test_mean_std_of_float32_values_near_its_largest_is_finite_in_and_out_of_jit():
    """3e38 + 3e38 and 3e38 - -3e38 overflow float32 (max 3.4e38): [3e38, 3e38] read mean inf
    and std inf, and merging batches [3e38] and [-3e38] read mean -inf and std inf, though the
    mean and std of each are float32 numbers."""
    cases = {  # values: (mean, population std), from numpy in float64
        (3e38, 3e38): (3e38, 0.0),
        (3e38, -3e38): (0.0, 3e38),
        (3e38, -1e38, 2e38): (4e38 / 3, np.std([3e38, -1e38, 2e38])),
        (-3.4e38, 3.4e38, 3.4e38, -3.4e38): (0.0, 3.4e38),
    }
    one_batch = jax.jit(MeanStd.from_model_output)
    merged = jax.jit(
        lambda v: functools.reduce(
            lambda a, b: a.merge(b), (MeanStd.from_model_output(x) for x in v)
        )
    )
    for values, (mean, std) in cases.items():
        array = jnp.array(values, jnp.float32)
        results = {
            "eager": MeanStd.from_model_output(array),
            "jit": one_batch(array),
            "merged": merged(array),
            "merged eager": functools.reduce(
                lambda a, b: a.merge(b), (MeanStd.from_model_output(x) for x in array)
            ),
        }
        for how, stats in results.items():
            got = (float(stats.compute()), float(stats.std()))
            assert got == (pytest.approx(mean, rel=1e-6), pytest.approx(std, rel=1e-6)), (
                values,
                how,
            )


def test_metrics_work_inside_jit():
    @jax.jit
    def step(values):
        return {
            "sum": Sum.from_model_output(values).merge(Sum.from_model_output(values)),
            "max": Max.from_model_output(values).merge(Max.empty()),
            "stats": MeanStd.from_model_output(values).merge(MeanStd.from_model_output(values)),
            "avg": AveragePerStep.from_model_output(values).merge(AveragePerStep.empty()),
            "rate": TimeRate.from_model_output(values.shape[0]),
            "sps": StepsPerTime.from_model_output().merge(StepsPerTime.from_model_output()),
        }

    out = step(jnp.array([1.0, -2.0, 4.0]))
    assert float(out["sum"].compute()) == 6.0
    assert float(out["max"].compute()) == 4.0
    np.testing.assert_allclose(out["stats"].compute(), 1.0)
    assert int(out["stats"].count) == 6
    assert int(out["avg"].steps) == 1 and float(out["avg"].total) == 3.0
    assert out["rate"].duration is None and float(out["rate"].numerator) == 3.0
    assert int(out["sps"].steps) == 2


def test_mask_shape_mismatch_names_shapes():
    with pytest.raises(ValueError) as error:
        Max.from_model_output(jnp.zeros((2, 4)), mask=jnp.ones(3))
    assert str(error.value) == (
        "Max.from_model_output: mask of shape (3,) does not match the leading dimensions of "
        "values of shape (2, 4); expected a mask of shape (2,) or (2, 1) (per example) or "
        "(2, 4) (per element)."
    )
    # 1-D values: one shape, once (it read "(3,) (per example) or (3,) (per element)")
    with pytest.raises(ValueError) as error:
        Sum.from_model_output(jnp.ones(3), mask=jnp.ones((3, 2)))
    assert str(error.value).endswith("expected a mask of shape (3,), one per value.")


def test_a_0d_mask_is_reported_with_its_own_shape():
    """A 0-d mask beside (2,) values was reported as "mask of shape (1,)", a shape never passed."""
    for metric in (Sum, MeanStd):
        with pytest.raises(ValueError) as error:
            metric.from_model_output(jnp.array([1.0, 3.0]), mask=jnp.array(True))
        assert str(error.value) == (
            f"{metric.__name__}.from_model_output: mask of shape () does not match the leading "
            "dimensions of values of shape (2,); expected a mask of shape (2,), one per value; "
            "a 0-d mask is not spread over the batch (CLU's metrics refuse it too): to keep or "
            "drop the whole batch, pass mask=jnp.full((2,), mask)."
        )
    # A batch of one is a batch: refused as the classification metrics refuse it (it was
    # taken as a (1,) mask here while Precision took a 0-d mask over any batch).
    with pytest.raises(ValueError, match=r"mask=jnp.full\(\(1,\), mask\)"):
        Sum.from_model_output(jnp.array([5.0]), mask=jnp.array(False))
    # Beside a 0-d value (a step's loss) a 0-d mask still keeps or drops it.
    assert float(Sum.from_model_output(jnp.float32(5.0), mask=jnp.array(True)).compute()) == 5.0
    assert float(Sum.from_model_output(jnp.float32(5.0), mask=jnp.array(False)).compute()) == 0.0


def test_a_per_example_mask_of_shape_b_1_broadcasts_as_in_clu():
    """A (B, 1) mask beside (B, L) values, which CLU's `Average` takes, was refused."""
    values, mask = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), jnp.array([[True], [False]])
    assert float(Sum.from_model_output(values, mask=mask).compute()) == 6.0
    assert float(Max.from_model_output(values, mask=mask).compute()) == 3.0
    average = clu_metrics.Average.from_model_output(values, mask=mask)
    assert float(average.compute()) == float(MeanStd.from_model_output(values, mask=mask).mean)
    with pytest.raises(ValueError, match=r"mask of shape \(1, 3\)"):  # the batch dim must match
        Sum.from_model_output(values, mask=jnp.ones((1, 3), bool))


# --- unset steps / duration, keyword-only construction -----------------------------------


@pytest.mark.parametrize(
    "metric, field",
    [
        (Time(), "duration"),
        (TimeRate(numerator=1.0), "duration"),
        (StepsPerTime(steps=2), "duration"),
        (Step(steps=None), "steps"),
        (AveragePerStep(total=1.0, steps=None), "steps"),
    ],
)
def test_unset_steps_or_duration_raise_value_error(metric, field):
    setter = "set_time_metrics_duration" if field == "duration" else "set_step_metrics_num_steps"
    with pytest.raises(ValueError, match=rf"{type(metric).__name__}\.{field} is None.*{setter}"):
        metric.compute()


def test_merging_after_duration_is_set_raises():
    timed = mm.set_time_metrics_duration({"r": TimeRate(numerator=1.0)}, 1.0)["r"]
    with pytest.raises(ValueError, match="after their duration was set"):
        timed.merge(TimeRate(numerator=1.0))


@pytest.mark.parametrize("metric", [Time(), StepsPerTime(steps=2), TimeRate(numerator=1.0)])
def test_every_time_metric_refuses_a_merge_after_its_duration_is_set(metric):
    """T5X's Time.merge kept its own duration and its StepsPerTime.merge dropped it (2 s
    merged with 3 s read 2 s, or unset); here all three refuse, as the README says."""
    timed = mm.set_time_metrics_duration(metric, 2.0)
    for a, b in ((timed, metric), (metric, timed), (timed, timed)):
        with pytest.raises(ValueError, match="after their duration was set"):
            a.merge(b)
    merged = mm.set_time_metrics_duration(metric.merge(metric), 2.0)  # merge, then set
    assert float(merged.compute()) == {Time: 2.0, StepsPerTime: 2.0, TimeRate: 1.0}[type(metric)]


def test_merging_unset_steps_raises():
    """The error blamed compute() ("Set it on the host before compute()") for a merge."""
    unset = AveragePerStep.from_model_output(jnp.array([1.0, 2.0]), steps=None)
    with pytest.raises(ValueError) as info:
        AveragePerStep(total=1.0).merge(unset)
    assert str(info.value).startswith(
        "AveragePerStep.merge: steps is None in other; merged steps add up, so each metric "
        "needs a count: make them with steps=1 (the default)"
    )
    with pytest.raises(ValueError, match=r"^StepsPerTime\.merge: steps is None in self and other"):
        StepsPerTime(steps=None).merge(StepsPerTime(steps=None))
    merged = AveragePerStep.from_model_output(jnp.array([1.0, 2.0])).merge(AveragePerStep(total=3))
    assert merged.steps == 2 and float(merged.compute()) == 3.0


def _cross_type_pairs():
    from metrics_manager.classification import Precision, Recall  # noqa: PLC0415

    x = jnp.array([1.0, 3.0])
    logits, labels = jnp.array([[2.0, 0.0], [0.0, 2.0]]), jnp.array([0, 0])
    return [
        (Sum.from_model_output(x), clu_metrics.Average.from_model_output(x)),
        (AveragePerStep.from_model_output(x), Sum.from_model_output(x)),
        (Step(), AveragePerStep.from_model_output(x)),
        (StepsPerTime(steps=1), Step()),
        (Time(), TimeRate.from_model_output(3)),
        (TimeRate.from_model_output(3), Time()),
        (Max.from_model_output(x), Min.from_model_output(x)),
        (MeanStd.from_model_output(x), mm.Welford.from_model_output(x)),
        (
            Precision.from_model_output(logits, labels, average="micro"),
            Recall.from_model_output(logits, labels, average="micro"),
        ),
    ]


@pytest.mark.parametrize("pair", range(9))
def test_merge_refuses_another_metric_type(pair):
    """A merge across types went through: Sum(4).merge(Average(total=4, count=2)) read 8,
    Max(3).merge(Min(1)) read 3 as a max, a Precision merged a Recall's counts, and
    AveragePerStep.merge(Sum) raised AttributeError: 'Sum' object has no attribute 'steps'."""
    a, b = _cross_type_pairs()[pair]
    mine, theirs = type(a).__qualname__, type(b).__qualname__
    with pytest.raises(TypeError) as info:
        a.merge(b)
    assert str(info.value) == (
        f"{mine}.merge: expected {mine}, got {theirs}; merge metrics of one type (keep one "
        "metric type per key)"
    )
    with pytest.raises(TypeError, match=f"^{mine}\\.merge: expected {mine}, got {theirs};"):
        jax.jit(lambda a, b: a.merge(b))(a, b)  # refused when traced, before any device work
    if isinstance(a, Sum):  # the same type still merges: 1 + 3 + 1 + 3
        assert float(a.merge(Sum.from_model_output(jnp.array([1.0, 3.0]))).compute()) == 8.0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: AveragePerStep(5, 1.0), "AveragePerStep(steps=..., total=...); got 2"),
        (lambda: TimeRate(3.0), "TimeRate(duration=..., numerator=...); got 1"),
        (lambda: StepsPerTime(8), "StepsPerTime(duration=..., steps=...); got 1"),
        (lambda: Step(1), "Step(steps=...); got 1"),
        (lambda: Time(2.0), "Time(duration=...); got 1"),
        (lambda: MeanStd(1, 2.0, 0.0), "MeanStd(count=..., mean=..., std_dev=...); got 3"),
    ],
)
def test_positional_construction_is_refused_where_order_is_a_trap(make, message):
    """Python's "AveragePerStep.__init__() takes 1 positional argument but 3 were given"
    named neither the keywords nor that T5X's AveragePerStep(5, 1.0) means steps=5."""
    with pytest.raises(TypeError) as info:
        make()
    name = message.split("(")[0]
    assert str(info.value) == f"{name} takes its fields by keyword, {message} positional"


def test_a_subclass_field_that_is_not_keyword_only_still_comes_positionally():
    # T5X's way to add a field to a Step: Tokens(6.0, steps=2) raised "Tokens takes its
    # fields by keyword", though `count` is positional (Python itself takes it so).
    @flax.struct.dataclass
    class Tokens(Step):
        count: float = 0.0

        def compute(self):
            return self.count / self.steps

    assert Tokens(6.0, steps=2).compute() == 3.0
    with pytest.raises(TypeError) as info:
        Tokens(6.0, 2)
    assert str(info.value) == (
        "Tokens takes its fields by keyword, Tokens(count, steps=...); got 2 positional"
    )


# --- host-side functions -----------------------------------------------------------------


def test_setters_replace_only_their_metrics_and_leave_input_alone():
    metrics = {
        "sum": Sum(1.0),
        "avg": AveragePerStep(total=6.0, steps=7),
        "sps": StepsPerTime(steps=3),
        "rate": TimeRate(numerator=4.0),
        "acc": clu_metrics.Average(total=jnp.array(1.0), count=jnp.array(2)),
    }
    out = mm.set_step_metrics_num_steps(mm.set_time_metrics_duration(metrics, 2.0), 3)
    assert metrics["avg"].steps == 7 and metrics["rate"].duration is None
    assert out["sum"] is metrics["sum"] and out["acc"] is metrics["acc"]
    assert out["avg"].compute() == 2.0
    assert out["sps"].compute() == 1.5
    assert out["rate"].compute() == 2.0


def test_setters_reach_into_clu_collections():
    collection = clu_metrics.Collection.create_collection(sps=StepsPerTime(steps=10))
    out = mm.set_step_metrics_num_steps(mm.set_time_metrics_duration({"c": collection}, 4.0), 2)
    assert out["c"].sps.compute() == 0.5


@pytest.mark.parametrize("wrap", [np.array, jnp.asarray])
def test_setters_take_0d_arrays_as_t5x_does(wrap):
    # np.array(2) and jnp.int32(2) were refused as "must be an int" / "number of seconds".
    metrics = {"avg": AveragePerStep(total=6.0), "sps": StepsPerTime(steps=1)}
    out = mm.set_step_metrics_num_steps(mm.set_time_metrics_duration(metrics, wrap(1.5)), wrap(3))
    assert out["avg"].compute() == 2.0  # 6 / 3 steps
    assert out["sps"].compute() == 2.0  # 3 steps / 1.5 s
    assert type(out["avg"].steps) is int and type(out["sps"].duration) is float
    with pytest.raises(TypeError, match="num_steps must be an int, got 2.5"):
        mm.set_step_metrics_num_steps(metrics, wrap(2.5))


def test_t5x_shape_obj_to_defined_obj_starts_merges_from_identities():
    # T5X's name raised AttributeError; T5X's zeros made a Max of losses below 0 read 0.
    def step():
        x = jnp.array([-3.0, -1.0])
        return {
            "max": Max.from_model_output(x),
            "min": Min.from_model_output(-x),
            "loss": AveragePerStep.from_model_output(x),
            "sum": Sum(jnp.ones(3, jnp.int32)),
            "last": clu_metrics.LastValue.from_model_output(jnp.float32(-2.0)),
            "sps": StepsPerTime.from_model_output(),
            "t": Time(),
            "c": clu_metrics.Collection.create_collection(top=Max.from_model_output(x)),
        }

    start = {k: mm.shape_obj_to_defined_obj(v) for k, v in jax.eval_shape(step).items()}
    assert float(start["max"].value) == -math.inf and float(start["min"].value) == math.inf
    assert start["sum"].total.dtype == jnp.int32 and start["sum"].total.tolist() == [0, 0, 0]
    assert start["t"].duration is None and int(start["sps"].steps) == 0
    merged = {k: m.merge(step()[k]) for k, m in start.items()}
    assert float(merged["max"].compute()) == -1.0  # T5X's zeros: 0.0
    assert float(merged["min"].compute()) == 1.0
    assert float(merged["loss"].compute()) == -4.0  # -4 over 0 + 1 steps
    assert float(merged["last"].compute()) == -2.0
    assert int(merged["sps"].steps) == 1
    assert float(merged["c"].compute()["top"]) == -1.0


def test_shape_obj_to_defined_obj_takes_the_eval_shape_of_a_metrics_dict():
    # The dict jax.eval_shape gives for a step's metrics raised AttributeError ("type object
    # 'dict' has no attribute 'empty'"); each value now starts from its identity.
    def step():
        x = jnp.array([-3.0, -1.0])
        return {"max": Max.from_model_output(x), "nested": {"min": Min.from_model_output(-x)}}

    start = mm.shape_obj_to_defined_obj(jax.eval_shape(step))
    assert sorted(start) == ["max", "nested"]
    assert float(start["max"].value) == -math.inf
    assert float(start["nested"]["min"].value) == math.inf
    assert float(start["max"].merge(step()["max"]).compute()) == -1.0
    with pytest.raises(TypeError, match=r"got tuple .*jax.eval_shape\(step\)\[1\]"):
        mm.shape_obj_to_defined_obj(jax.eval_shape(lambda: (jnp.float32(1.0), step())))


def test_shape_obj_to_defined_obj_keeps_fields_without_a_shape_as_documented():
    # A concrete metric's Python number (steps=1) raised AttributeError on its identity's
    # path; T5X keeps it, as the zeros path here does.
    start = mm.shape_obj_to_defined_obj(AveragePerStep(total=jnp.float32(4.0), steps=1))
    assert start.steps == 1 and type(start.steps) is int and float(start.total) == 0.0
    start = mm.shape_obj_to_defined_obj(Max(value=jnp.float32(-2.0)))
    assert float(start.value) == -math.inf


def test_setters_reach_metrics_nested_in_dicts_lists_and_tuples():
    # T5X's setters are tree maps; nested metrics kept steps=1 here: 20 / 1 step read 20.
    metrics = {
        "train": {"loss": AveragePerStep(total=20.0), "sps": StepsPerTime(steps=9)},
        "pair": (TimeRate(numerator=6.0), [AveragePerStep(total=6.0)]),
        "lr": 0.5,
    }
    out = mm.set_step_metrics_num_steps(mm.set_time_metrics_duration(metrics, 3.0), 2)
    assert out["train"]["loss"].compute() == 10.0  # 20 / 2 steps
    assert out["train"]["sps"].compute() == 2 / 3.0
    assert out["pair"][0].compute() == 2.0  # 6 / 3 s
    assert out["pair"][1][0].compute() == 3.0
    assert out["lr"] == 0.5
    assert metrics["train"]["loss"].steps == 1  # the input is not changed


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: mm.set_step_metrics_num_steps({}, 2.5), TypeError, "num_steps must be an int"),
        (lambda: mm.set_step_metrics_num_steps({}, True), TypeError, "num_steps must be an int"),
        (lambda: mm.set_step_metrics_num_steps({}, 0), ValueError, "must be positive, got 0"),
        (lambda: mm.set_step_metrics_num_steps([Step()], 1), TypeError, "got list"),
        (lambda: mm.set_time_metrics_duration({}, "2"), TypeError, "number of seconds"),
        (lambda: mm.set_time_metrics_duration({}, -1.0), ValueError, ">= 0 seconds, got -1.0"),
        (lambda: mm.set_time_metrics_duration({}, float("nan")), ValueError, "finite"),
    ],
)
def test_setters_validate_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_predicates():
    assert mm.is_metric_obj(Sum(1.0)) and mm.is_metric_obj(clu_metrics.Average.empty())
    assert mm.is_metric_obj(clu_metrics.Collection.create_collection(s=Sum(1.0)))
    assert not any(mm.is_metric_obj(x) for x in (1.0, None, jnp.ones(2), {"a": Sum(1.0)}))
    assert all(mm.is_time_metric(x) for x in (Time(), TimeRate(numerator=1), StepsPerTime()))
    assert not any(mm.is_time_metric(x) for x in (Step(), Sum(1.0), AveragePerStep(total=1)))


def test_compute_metric_values_flattens_mean_std_and_collections():
    collection = clu_metrics.Collection.create_collection(
        acc=clu_metrics.Average(total=jnp.array(3.0), count=jnp.array(4)),
        stats=MeanStd.from_model_output(jnp.array([2.0, 4.0])),
    )
    values = mm.compute_metric_values({"sum": Sum(2.0), "c": collection})
    assert sorted(values) == ["c/acc", "c/stats", "c/stats/std", "sum"]
    assert all(type(v) is clu.values.Scalar for v in values.values())
    assert [float(values[k].value) for k in sorted(values)] == [0.75, 3.0, 1.0, 2.0]


def test_compute_metric_values_of_clu_std_alone_and_in_a_collection():
    # clu 0.0.12's Std.compute() calls jnp.clip(a_min=...), which current JAX refuses.
    std = clu_metrics.Std.from_model_output(jnp.array([1.0, 2.0, 4.0])).merge(
        clu_metrics.Std.from_model_output(jnp.array([3.0]))
    )
    collection = clu_metrics.Collection.create_collection(s=std)
    values = mm.compute_metric_values({"std": std, "c": collection})
    assert sorted(values) == ["c/s", "std"]
    assert (
        float(values["std"].value)
        == float(values["c/s"].value)
        == pytest.approx(np.std([1.0, 2.0, 4.0, 3.0]))
    )
    replicated = jax.tree.map(lambda x: jnp.stack([x, x]), collection)  # as pmap returns it
    with pytest.raises(ValueError, match=r"still replicated \(counter shape \(2,\)\).*reduce"):
        mm.compute_metric_values({"c": replicated})


def test_compute_metric_values_of_nothing_seen_is_nan_without_a_warning():
    # conftest makes warnings errors: numpy's 0/0 warning would raise here.
    values = mm.compute_metric_values(
        {"avg": clu_metrics.Average.empty(), "rate": StepsPerTime(steps=np.int32(3), duration=0.0)}
    )
    assert np.isnan(values["avg"].value) and values["rate"].value == np.inf


def test_the_host_helpers_take_what_merge_metrics_returns_as_t5x_users_call_them():
    from metrics_manager.merging import merge_metrics

    @jax.jit
    def two_steps(x):
        window = {
            "loss": AveragePerStep.from_model_output(x),
            "rate": StepsPerTime.from_model_output(),
        }
        return merge_metrics(merge_metrics(None, window), window)

    running = two_steps(jnp.float32(3.0))  # a PackedMetrics: steps 2, loss total 6
    stepped = mm.set_step_metrics_num_steps(running, 2)
    timed = mm.set_time_metrics_duration(stepped, 4.0)
    assert {k: float(v.value) for k, v in mm.compute_metric_values(timed).items()} == {
        "loss": 3.0,  # 6 / 2 steps
        "rate": 0.5,  # 2 steps / 4 s
    }
    with pytest.raises(TypeError, match=r"to metrics \(or what merge_metrics returns\), got list"):
        mm.compute_metric_values([running])


def test_compute_metric_values_rejects_non_metrics():
    with pytest.raises(TypeError, match=r"'a': float, 'b': NoneType"):
        mm.compute_metric_values({"a": 1.0, "b": None, "c": Sum(1.0)})


def test_types_work_in_a_clu_collection_via_from_output():
    Metrics = clu_metrics.Collection.create(
        loss=AveragePerStep.from_output("loss"),
        loss_max=Max.from_output("loss"),
        loss_stats=MeanStd.from_output("loss"),
    )
    step1 = Metrics.single_from_model_output(loss=jnp.array([1.0, 5.0]), mask=jnp.array([1, 0]))
    step2 = Metrics.single_from_model_output(loss=jnp.array([3.0, 2.0]))
    merged = Metrics.empty().merge(step1).merge(step2)
    values = merged.compute()
    assert float(values["loss"]) == (1.0 + 3.0 + 2.0) / 2
    assert float(values["loss_max"]) == 3.0
    np.testing.assert_allclose(values["loss_stats"], 2.0)
    # CLU's reduce() over a stacked (e.g. all-gathered) collection: one step across devices.
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), step1, step2)
    reduced = stacked.reduce()
    assert int(reduced.loss.steps) == 1 and float(reduced.loss.total) == 6.0


def test_mean_std_of_one_batch_near_1e7_is_exact_to_float32():
    # 1000 values base + (i % 7), each exact in float32; numpy in float64 is the reference.
    offsets = np.arange(1000) % 7
    for base in (1e5, 1e6, 1e7):
        values = np.float32(base) + offsets.astype(np.float32)
        stats = MeanStd.from_model_output(jnp.asarray(values))
        reference = values.astype(np.float64)
        assert float(stats.compute()) == pytest.approx(reference.mean(), rel=1e-7)
        assert float(stats.std()) == pytest.approx(reference.std(), rel=1e-5)
    masked = MeanStd.from_model_output(jnp.array([jnp.nan, 1e7, 1e7 + 2]), jnp.array([0, 1, 1]))
    assert (float(masked.compute()), float(masked.std())) == (1e7 + 1, 1.0)
    huge = MeanStd.from_model_output(jnp.array([-3e38, 3e38, 3e38], jnp.float32))
    assert float(huge.compute()) == pytest.approx(1e38, rel=1e-6)  # no correction past float32
    nothing = MeanStd.from_model_output(jnp.array([jnp.inf, 5.0]), jnp.array([0, 0]))
    assert (float(nothing.count), float(nothing.mean), float(nothing.std_dev)) == (0.0, 0.0, 0.0)


def test_counts_of_more_than_2_31_tokens_do_not_wrap():
    # 600 steps of 4Mi tokens merged in a jitted scan: an int32 count wrapped to -1778384896
    # and MeanStd, Perplexity and TopKAccuracy read NaN.
    from metrics_manager.classification import Perplexity, TopKAccuracy

    tokens = 4 * 2**20
    values = jnp.where(jnp.arange(tokens) % 2 == 0, 1.5, 2.5)  # mean 2, std 0.5
    logits = jnp.zeros((tokens // 2**12, 2**12, 4)).at[..., 0].set(1.0)
    labels = jnp.broadcast_to(jnp.arange(2**12) % 2, logits.shape[:-1])  # top-1 right half
    step = {
        "stats": MeanStd.from_model_output(values),
        "ppl": Perplexity.from_model_output(logits, labels),
        "top1": TopKAccuracy.from_model_output(logits, labels, k=1),
    }

    @jax.jit
    def window(step):
        def body(carry, _):
            return jax.tree.map(lambda a, b: a.merge(b), carry, step, is_leaf=_is_metric), None

        return jax.lax.scan(body, step, length=599)[0]

    merged = window(step)
    assert float(merged["stats"].count) == 600 * tokens > 2**31
    assert float(merged["stats"].compute()) == 2.0 and float(merged["stats"].std()) == 0.5
    expected_ppl = math.exp(
        -np.log(np.exp(1.0) / (np.exp(1.0) + 3)) / 2 - np.log(1 / (np.exp(1.0) + 3)) / 2
    )
    assert float(merged["ppl"].compute()) == pytest.approx(expected_ppl, rel=1e-5)
    assert float(merged["top1"].compute()) == 0.5


def _is_metric(x) -> bool:
    return isinstance(x, clu_metrics.Metric)


_DONATED = {  # each kind, and what it reads after merging [1, 3] into its empty()
    Sum: lambda m: m.compute(),
    AveragePerStep: lambda m: m.compute(),  # 4 over one step
    TimeRate: lambda m: m.numerator,  # the rate needs the window's duration
    Max: lambda m: m.compute(),
    Min: lambda m: m.compute(),
    MeanStd: lambda m: m.compute(),
    mm.Welford: lambda m: m.compute(),
}


@pytest.mark.parametrize("kind", list(_DONATED), ids=lambda kind: kind.__name__)
def test_empty_can_be_donated(kind):
    """`empty()` gives each field its own buffer: MeanStd's mean and deviation shared one zero, and a
    donating step failed with "Attempt to donate the same buffer twice"."""
    step = jax.jit(lambda window, x: window.merge(kind.from_model_output(x)), donate_argnums=0)
    window = step(kind.empty(), jnp.array([1.0, 3.0]))
    expected = {Max: 3.0, Min: 1.0, MeanStd: 2.0, mm.Welford: 2.0}.get(kind, 4.0)
    assert float(_DONATED[kind](window)) == expected
