"""The MetricWriter contract: abstract methods, CLU names, shared checks, errors."""

from __future__ import annotations

import inspect
import io
import json
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import writers
from writers import MetricWriter, WriterClosedError, WriterError
from writers._checks import check_call, check_step, images_as_uint8, to_number

CLU_SIGNATURES = {
    "write_summaries": ["self", "step", "values", "metadata"],
    "write_scalars": ["self", "step", "scalars"],
    "write_images": ["self", "step", "images"],
    "write_videos": ["self", "step", "videos"],
    "write_audios": ["self", "step", "audios", "sample_rate"],
    "write_texts": ["self", "step", "texts"],
    "write_histograms": ["self", "step", "arrays", "num_buckets"],
    "write_hparams": ["self", "hparams"],
    "flush": ["self"],
    "close": ["self"],
}


def test_metric_writer_has_clu_method_and_parameter_names():
    for name, params in CLU_SIGNATURES.items():
        sig = inspect.signature(getattr(MetricWriter, name))
        assert list(sig.parameters) == params, name
    audio = inspect.signature(MetricWriter.write_audios).parameters["sample_rate"]
    assert audio.kind is inspect.Parameter.KEYWORD_ONLY
    assert (
        inspect.signature(MetricWriter.write_histograms).parameters["num_buckets"].default is None
    )


def test_metric_writer_is_abstract_in_every_method():
    assert set(MetricWriter.__abstractmethods__) == set(CLU_SIGNATURES)
    with pytest.raises(TypeError):
        MetricWriter()  # type: ignore[abstract]


@pytest.mark.parametrize(
    "cls",
    [
        writers.LoggingWriter,
        writers.NoopWriter,
        writers.ConsoleWriter,
        writers.JsonlWriter,
        writers.TensorBoardWriter,
        writers.MultiWriter,
        writers.AsyncWriter,
    ],
)
def test_every_writer_keeps_clu_signatures(cls):
    for name, params in CLU_SIGNATURES.items():
        assert list(inspect.signature(getattr(cls, name)).parameters) == params, (cls, name)


def test_check_step_accepts_integers_and_rejects_the_rest():
    assert check_step(0) == 0
    assert check_step(np.int64(7)) == 7
    assert check_step(np.array(5, dtype=np.int32)) == 5
    assert type(check_step(np.uint8(3))) is int
    for bad in (1.0, "3", True, None, np.float32(2), np.array([1, 2])):
        with pytest.raises(TypeError, match="non-negative integer"):
            check_step(bad)
    with pytest.raises(ValueError, match="got -1"):
        check_step(-1)


def test_check_call_lists_step_and_key_problems_in_one_error():
    with pytest.raises(TypeError) as info:
        check_call("W.write_scalars", -2, {3: 1.0, "": 2.0})
    # Each problem once, counted: the keys' two came nested as one ("  - 2 problems:").
    assert str(info.value) == (
        "W.write_scalars: 3 problems:\n"
        "  - every key must be a str, got 3 (int). Convert keys with str().\n"
        "  - step must be a non-negative integer, got -2 (steps are int64 in TensorBoard and "
        "JSONL, so below 2**63). Check the step counter you pass in.\n"
        "  - keys must be non-empty names, got ['']. Give each value a name such as 'loss' or "
        "'eval/accuracy'."
    )
    with pytest.raises(ValueError, match=r"non-empty names, got \[' '\]"):
        check_call("W.write_scalars", 0, {" ": 1.0})
    with pytest.raises(TypeError) as info:
        check_call("W.write_scalars", 0, {1: 1.0, "": 2.0})
    assert "1 (int)" in str(info.value) and "['']" in str(info.value)
    with pytest.raises(TypeError, match="expected a mapping"):
        check_call("W.write_scalars", 0, [("a", 1.0)])


def test_to_number_keeps_python_types_and_rejects_non_scalars():
    assert to_number("a", True) == 1 and type(to_number("a", True)) is int
    assert type(to_number("a", np.float32(0.5))) is float
    assert type(to_number("a", np.int16(4))) is int
    assert to_number("a", np.array([[2.5]])) == 2.5
    assert np.isnan(to_number("a", float("nan")))
    with pytest.raises(
        ValueError, match=r"'a' must hold exactly one number, got an array of shape \(2,\)"
    ):
        to_number("a", np.zeros(2))
    with pytest.raises(TypeError, match="'a' must be a number"):
        to_number("a", "1.0")
    # write_values took a Decimal as a number, then write_scalars refused it as none; a
    # Fraction past float64's range raised a bare OverflowError naming no key.
    assert (to_number("a", Decimal("0.25")), to_number("a", Fraction(1, 4))) == (0.25, 0.25)
    assert to_number("a", Fraction(-(10**400), 3)) == -math.inf
    assert math.isnan(to_number("a", Decimal("NaN")))
    # A signaling NaN: float() raised a bare "cannot convert signaling NaN to float".
    assert math.isnan(to_number("a", Decimal("sNaN")))


def test_images_as_uint8_scales_floats_and_clips():
    inf, nan = np.inf, np.nan  # no overflow warning for inf (warnings are errors here)
    floats = np.array([[[0.0], [0.5], [1.5], [inf], [-inf], [nan]]], np.float32)  # [1, 6, 1]
    out = images_as_uint8(floats)
    assert out.shape == (1, 1, 6, 1) and out.dtype == np.uint8
    np.testing.assert_array_equal(out.reshape(-1), [0, 127, 255, 255, 0, 0])
    ints = np.array([[[-5], [300]]], dtype=np.int32)
    np.testing.assert_array_equal(images_as_uint8(ints).reshape(-1), [0, 255])


def test_float_pixels_are_what_clu_and_tensorboard_make_of_them():
    """CLU's `tf.summary.image` converts floats with `tf.image.convert_image_dtype(x, uint8,
    saturate=True)`: `x * 255.5` in the image's dtype, clipped, truncated. Rounding `x * 255`,
    0.5 was 128 and 0.25 was 64 where CLU's TensorBoard images show 127 and 63."""
    floats = [0.0, 0.25, 0.5, 0.75, 1.0, 1 / 255, 254 / 255]
    expected = [0, 63, 127, 191, 255, 1, 254]  # floor(x * 255.5), clipped
    for dtype in (np.float16, np.float32, np.float64):
        out = images_as_uint8(np.array(floats, dtype)[None, :, None])
        np.testing.assert_array_equal(out.reshape(-1), expected, err_msg=str(dtype))
        # uint8 pixels as floats (k / 255) come back as they were
        k = np.arange(256)
        np.testing.assert_array_equal(
            images_as_uint8((k / 255).astype(dtype)[None, :, None])[0, 0, :, 0], k
        )


def test_writer_error_names_every_failing_writer_and_keeps_the_causes():
    first, second = OSError("disk full"), ValueError("bad")
    err = WriterError("MultiWriter.write_scalars", [("jsonl", first), ("tb", second)])
    assert str(err) == (
        "MultiWriter.write_scalars: 2 writers failed: jsonl: OSError: disk full; "
        "tb: ValueError: bad"
    )
    assert err.failures == [("jsonl", first), ("tb", second)]
    assert issubclass(WriterClosedError, RuntimeError)


def test_context_manager_closes(tmp_path):
    with writers.JsonlWriter(tmp_path / "m.jsonl") as w:
        w.write_scalars(0, {"a": 1})
    with pytest.raises(WriterClosedError, match="closed"):
        w.write_scalars(1, {"a": 1})


def test_entering_a_closed_writer_raises_at_once(tmp_path):
    """`with w:` on a closed writer entered silently; only the block's first write raised,
    after any work before it. It now raises there, as a closed MetricsManager does."""
    made = {
        "TensorBoardWriter": writers.TensorBoardWriter(tmp_path / "tb"),
        "JsonlWriter": writers.JsonlWriter(tmp_path / "log"),
        "ConsoleWriter": writers.ConsoleWriter(stream=io.StringIO()),
        "MultiWriter": writers.MultiWriter([writers.LoggingWriter()]),
        "AsyncWriter(LoggingWriter)": writers.AsyncWriter(writers.LoggingWriter()),
    }
    for name, w in made.items():
        with w:  # an open writer enters
            w.write_scalars(1, {"a": 1.0})
        entered = []
        with pytest.raises(WriterClosedError) as info:
            with w:
                entered.append(name)
        assert entered == []
        assert str(info.value) == (
            f"{name}.__enter__: the writer is closed; create a new one to write more."
        )
    assert [line["a"] for line in writers.read_jsonl(tmp_path / "log" / "metrics.jsonl")] == [1.0]


def test_docstring_examples_run(tmp_path, monkeypatch):
    import doctest
    import importlib
    import pkgutil

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # examples use tempfile.mkdtemp()
    monkeypatch.setattr("tempfile.tempdir", None)
    modules = ["writers"] + [f"writers.{m.name}" for m in pkgutil.iter_modules(writers.__path__)]
    attempted = 0
    for name in modules:
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted >= 40


BACKENDS = {
    "log": lambda tmp: writers.LoggingWriter(),
    "console": lambda tmp: writers.ConsoleWriter(io.StringIO()),
    "jsonl": lambda tmp: writers.JsonlWriter(tmp / "m.jsonl"),
    "tensorboard": lambda tmp: writers.TensorBoardWriter(tmp),
}

BAD_CALLS = [
    ("negative step", ValueError, lambda w: w.write_scalars(-1, {"a": 1.0})),
    ("float step", TypeError, lambda w: w.write_scalars(1.0, {"a": 1.0})),
    ("bool step", TypeError, lambda w: w.write_texts(True, {"a": "x"})),
    ("int key", TypeError, lambda w: w.write_scalars(0, {1: 1.0})),
    ("empty key", ValueError, lambda w: w.write_texts(0, {"": "x"})),
    ("not a mapping", TypeError, lambda w: w.write_scalars(0, [1.0])),
    ("string scalar", TypeError, lambda w: w.write_scalars(0, {"a": "1"})),
    ("vector scalar", ValueError, lambda w: w.write_scalars(0, {"a": np.ones(3)})),
    ("2-D image", ValueError, lambda w: w.write_images(0, {"i": np.zeros((4, 4))})),
    ("5 channels", ValueError, lambda w: w.write_images(0, {"i": np.zeros((4, 4, 5))})),
    ("3-D video", ValueError, lambda w: w.write_videos(0, {"v": np.zeros((4, 4, 3))})),
    ("2-D audio", ValueError, lambda w: w.write_audios(0, {"a": np.zeros((4, 1))}, sample_rate=8)),
    # Empty media: numpy's reshape error, an unreadable PNG or wave's error in the encoders.
    ("empty image", ValueError, lambda w: w.write_images(0, {"i": np.zeros((0, 4, 3))})),
    ("empty video", ValueError, lambda w: w.write_videos(0, {"v": np.zeros((1, 0, 4, 4, 3))})),
    (
        "no channel",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 4, 0))}, sample_rate=8),
    ),
    (
        "zero rate",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 4, 1))}, sample_rate=0),
    ),
    (  # wave's struct.error in TensorBoard's encoder, taken by the others
        "rate past a WAV header",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 4, 1))}, sample_rate=2**32),
    ),
    (
        "[N, C, T] clip of more channels than a WAV holds",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 1, 40000))}, sample_rate=8000),
    ),
    (  # 1 s at 16 kHz: a WAV of 16,000 channels of 1 sample
        "[N, C, T] clip of more channels than samples",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 1, 16000))}, sample_rate=16000),
    ),
    (  # a mono byte rate of 2 * 2**31: wave's struct.error likewise
        "byte rate past a WAV header",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 4, 1))}, sample_rate=2**31),
    ),
    (
        "float rate",
        TypeError,
        lambda w: w.write_audios(0, {"a": np.zeros((1, 4, 1))}, sample_rate=8.5),
    ),
    ("NaN histogram", ValueError, lambda w: w.write_histograms(0, {"h": np.array([np.nan])})),
    # NaN and infinities in media were written as black or white pixels and silence.
    ("NaN image", ValueError, lambda w: w.write_images(0, {"i": np.full((2, 2, 3), np.nan)})),
    (
        "Inf video",
        ValueError,
        lambda w: w.write_videos(0, {"v": np.full((1, 2, 2, 2, 1), np.inf, np.float32)}),
    ),
    (
        "NaN audio",
        ValueError,
        lambda w: w.write_audios(0, {"a": np.array([[[0.5], [np.nan]]])}, sample_rate=8),
    ),
    # Complex: the imaginary part was dropped (an all-imaginary histogram counted zeros).
    ("complex histogram", ValueError, lambda w: w.write_histograms(0, {"h": np.array([1j])})),
    (
        "complex video",
        ValueError,
        lambda w: w.write_videos(0, {"v": np.ones((1, 1, 2, 2, 3), complex)}),
    ),
    ("text not str", TypeError, lambda w: w.write_texts(0, {"t": b"x"})),
    ("int num_buckets", TypeError, lambda w: w.write_histograms(0, {"h": np.ones(3)}, 8)),
    ("0 buckets", ValueError, lambda w: w.write_histograms(0, {"h": np.ones(3)}, {"h": 0})),
    (  # a MemoryError in the writer, after the call
        "10**12 buckets",
        ValueError,
        lambda w: w.write_histograms(0, {"h": np.ones(3)}, {"h": 10**12}),
    ),
    # A typo: 'h' got the default 30 buckets, silently.
    (
        "buckets of no array",
        ValueError,
        lambda w: w.write_histograms(0, {"h": np.ones(3)}, {"hh": 3}),
    ),
    ("float buckets", TypeError, lambda w: w.write_histograms(0, {"h": np.ones(3)}, {"h": 2.5})),
    # TensorBoard and the wrappers refused it; JSONL, console and logging wrote the values.
    ("str metadata", TypeError, lambda w: w.write_summaries(0, {"s": np.ones(2)}, "foo")),
    # NumPy's own errors, naming neither the call nor the key (a wrapper took the key scalar,
    # and its wrapped writer refused it later, an AsyncWriter's a call late).
    ("ragged image", ValueError, lambda w: w.write_images(0, {"i": [[[0.0]], [[0.0], [1.0]]]})),
    ("PRNG key scalar", TypeError, lambda w: w.write_scalars(0, {"k": _prng_key()})),
    ("PRNG key histogram", TypeError, lambda w: w.write_histograms(0, {"h": _prng_key()})),
]
# What each refusal says, the same from every backend and wrapper (after the writer's name).
REFUSED = {
    "negative step": "step must be a non-negative integer, got -1 (steps are int64",
    "float step": "step must be a non-negative integer, got 1.0 of type float",
    "bool step": "step must be a non-negative integer, got True of type bool",
    "int key": "every key must be a str, got 1 (int)",
    "empty key": "keys must be non-empty names, got ['']",
    "not a mapping": "expected a mapping from name to value, got list",
    "string scalar": "scalar 'a' must be a number, got '1' of type str",
    "vector scalar": "scalar 'a' must hold exactly one number, got an array of shape (3,)",
    "2-D image": "image 'i' must have shape [H, W, C] or [N, H, W, C] with C in (1, 3, 4), "
    "got shape (4, 4).",
    "5 channels": "image 'i' must have shape [H, W, C] or [N, H, W, C] with C in (1, 3, 4), "
    "got shape (4, 4, 5).",
    "3-D video": "video 'v' must have shape [T, H, W, C] or [N, T, H, W, C] with C in "
    "(1, 3, 4), got shape (4, 4, 3).",
    "2-D audio": "audio 'a' must be a float array of shape [N, T, C] with values in [-1, 1], "
    "got dtype float64 and shape (4, 1).",
    "empty image": "image 'i' is empty (shape (0, 4, 3))",
    "empty video": "video 'v' is empty (shape (1, 0, 4, 4, 3))",
    "no channel": "audio 'a' is empty (shape (1, 4, 0))",
    "zero rate": "sample_rate must be a positive number of samples per second below 2**32 (a "
    "WAV header's 32 bits), got 0.",
    "rate past a WAV header": "sample_rate must be a positive number of samples per second "
    "below 2**32 (a WAV header's 32 bits), got 4294967296.",
    "[N, C, T] clip of more channels than a WAV holds": "audio 'a' has 40000 channels (shape "
    "(1, 1, 40000), [N, T, C]); a WAV holds at most 32767.",
    "[N, C, T] clip of more channels than samples": "audio 'a' has 16000 channels (shape "
    "(1, 1, 16000), [N, T, C]); more than its 1 sample per channel.",
    "byte rate past a WAV header": "sample_rate 2147483648 is too high for the WAV header",
    "float rate": "sample_rate must be an integer number of samples per second, got 8.5 of "
    "type float.",
    "NaN histogram": "histogram 'h' has 1 NaN/Inf entries out of 1;",
    "NaN image": "image 'i' has 12 NaN/Inf values out of 12; pixels need finite values.",
    "Inf video": "video 'v' has 8 NaN/Inf values out of 8; pixels need finite values.",
    "NaN audio": "audio 'a' has 1 NaN/Inf values out of 2; samples need finite values.",
    "complex histogram": "histogram 'h' must be real numbers, got dtype complex128.",
    "complex video": "video 'v' must be real numbers, got dtype complex128.",
    "text not str": "text 't' must be a str, got bytes b'x'",
    "int num_buckets": "num_buckets must map keys to bucket counts (ints >= 1) such as "
    "{'w': 64}, or be None for 30 each; got 8",
    "0 buckets": "num_buckets must map keys to bucket counts (ints >= 1) such as {'w': 64}, "
    "or be None for 30 each; got {'h': 0}",
    "10**12 buckets": "num_buckets for ['h'] must be at most 1,048,576, got 1,000,000,000,000",
    "buckets of no array": "num_buckets names ['hh'], which no array of the call has "
    "(arrays ['h'])",
    "float buckets": "num_buckets must map keys to bucket counts (ints >= 1) such as "
    "{'w': 64}, or be None for 30 each; got {'h': 2.5}",
    "str metadata": "metadata must be a SummaryMetadata proto, its serialized bytes, None, or "
    "a mapping of key to one of these; got str 'foo'.",
    "ragged image": "image 'i' must be an array of numbers, got list [[[0.0]], [[0.0], [1.0]]], "
    "which NumPy cannot read (setting an array element with a sequence.",
    "PRNG key scalar": "scalar 'k' must be a number, got PRNGKeyArray of shape () and dtype "
    "key<fry>, which NumPy cannot read (JAX array with PRNGKey dtype cannot be converted",
    "PRNG key histogram": "histogram 'h' must be an array of numbers, got PRNGKeyArray of "
    "shape () and dtype key<fry>, which NumPy cannot read (JAX array with PRNGKey dtype",
}


def _prng_key():
    import jax

    return jax.random.key(0)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_rejects_the_same_bad_input(backend, tmp_path):
    from tensorboard.backend.event_processing import event_accumulator as ea

    w = BACKENDS[backend](tmp_path)
    assert sorted(REFUSED) == sorted(name for name, _, _ in BAD_CALLS)
    for name, error, call in BAD_CALLS:
        with pytest.raises(error) as refused:
            call(w)
            pytest.fail(f"{backend} accepted {name}")
        message = str(refused.value)
        assert message.startswith(f"{type(w).__name__}.write_") and REFUSED[name] in message
    w.write_scalars(0, {"ok": float("nan")})  # NaN is a value, not an error
    w.close()
    with pytest.raises(WriterClosedError):
        w.write_scalars(1, {"a": 1.0})
    if backend == "jsonl":  # nothing of a refused call was written
        assert [(x["step"], x["ok"]) for x in writers.read_jsonl(tmp_path / "m.jsonl")] == [
            (0, "NaN")
        ]
    if backend == "tensorboard":
        acc = ea.EventAccumulator(str(tmp_path))
        acc.Reload()
        assert {kind: tags for kind, tags in acc.Tags().items() if tags} == {"scalars": ["ok"]}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_one_error_names_bad_buckets_or_sample_rate_and_bad_arrays_together(backend, tmp_path):
    # The bucket counts or sample rate were raised alone: fixing them only revealed the NaN
    # histogram or int16 clip of the same call (MultiWriter and AsyncWriter named both).
    w = BACKENDS[backend](tmp_path)
    with pytest.raises(ValueError) as info:
        w.write_histograms(0, {"h": np.array([np.nan, 1.0])}, {"h": 0})
    assert str(info.value).startswith(f"{type(w).__name__}.write_histograms: 2 problems:")
    assert "num_buckets must map keys" in str(info.value) and "1 NaN/Inf" in str(info.value)
    with pytest.raises(TypeError) as info:
        w.write_audios(0, {"a": np.zeros((1, 4, 1), np.int16)}, sample_rate=1.5)
    assert str(info.value).startswith(f"{type(w).__name__}.write_audios: 2 problems:")
    assert "got 1.5 of type float" in str(info.value) and "x / 32768" in str(info.value)
    w.close()


@pytest.mark.parametrize(
    ("shape", "dtype", "kind", "fix"),
    [
        ((4, 5), np.float32, "image", "Add a channel axis for grayscale (x[..., None])."),
        ((2, 3, 8, 8), np.float32, "image", "Move the channel axis last (np.moveaxis(x, -3, -1))."),
        # Gray + alpha: "move the channel axis" made it a (5, 2, 4) image, wrongly accepted.
        (
            (4, 5, 2),
            np.float32,
            "image",
            "Drop the alpha channel of a gray + alpha image (x[..., :1]).",
        ),
        (
            (1, 2, 4, 4, 3),
            np.float32,
            "image",
            "Write a video of shape [N, T, H, W, C] with write_videos.",
        ),
        # A float clip of the wrong shape was told to scale PCM samples.
        ((100, 2), np.float32, "audio", "Add a batch axis for one clip of shape [T, C] (x[None])."),
        (
            (100,),
            np.float32,
            "audio",
            "Add batch and channel axes for one mono clip (x[None, :, None]).",
        ),
        ((1, 100, 1), np.int16, "audio", "Scale PCM samples first: x / 32768 for int16."),
    ],
)
def test_a_bad_shape_gets_the_fix_for_its_own_mistake(tmp_path, shape, dtype, kind, fix):
    w = writers.JsonlWriter(tmp_path / "m.jsonl")
    call = {
        "image": lambda x: w.write_images(0, {"x": x}),
        "audio": lambda x: w.write_audios(0, {"x": x}, sample_rate=8000),
    }[kind]
    with pytest.raises(ValueError) as raised:
        call(np.zeros(shape, dtype))
    assert f"shape {shape}." in str(raised.value)
    assert str(raised.value).endswith(fix)
    w.close()


# TensorBoard's reader, compressing the histogram for its distributions view, overflows.
@pytest.mark.filterwarnings("ignore:overflow encountered in scalar multiply:RuntimeWarning")
def test_every_backend_writes_finite_values_near_float64s_limit(tmp_path):
    """A histogram whose sum overflows (its mean does not) broke the JSONL line ("Out of range
    float values are not JSON compliant") and gave the console "mean=inf"; an hparam int
    beyond float64 raised OverflowError in TensorBoard."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    huge = np.array([1.7e308, 1.7e308, 1.0])
    console = io.StringIO()
    backends = {name: make(tmp_path) for name, make in BACKENDS.items() if name != "console"}
    backends["console"] = writers.ConsoleWriter(console)
    for w in backends.values():
        w.write_histograms(1, {"h": huge})
        w.write_hparams({"n": 10**400})
        w.close()
    (line, hparams) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert line["h"]["mean"] == pytest.approx(1.7e308 / 3 * 2, rel=1e-15)
    assert (line["h"]["min"], line["h"]["max"], sum(line["h"]["counts"])) == (1.0, 1.7e308, 3)
    assert hparams["hparams"] == {"n": 10**400}  # JSON keeps the int exactly
    assert "mean=1.133e+308" in console.getvalue()
    events = ea.EventAccumulator(str(tmp_path), size_guidance={ea.HISTOGRAMS: 0})
    events.Reload()
    (event,) = events.Histograms("h")
    assert (event.histogram_value.min, event.histogram_value.max) == (1.0, 1.7e308)


def test_the_mean_of_float64_maxima_is_the_maximum_not_inf(tmp_path):
    # Their sum overflows, and so did the sum of each divided by 3: JSONL wrote "Infinity".
    top = float(np.finfo(float).max)
    console = io.StringIO()
    for w in (writers.JsonlWriter(tmp_path / "m.jsonl"), writers.ConsoleWriter(console)):
        w.write_histograms(1, {"h": np.full(3, top), "low": np.full(3, -top)})
        w.close()
    (line,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert (line["h"]["mean"], line["low"]["mean"]) == (top, -top)
    assert "mean=1.798e+308" in console.getvalue() and "mean=-1.798e+308" in console.getvalue()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_backend_bins_a_bool_histogram_as_zeros_and_ones(backend, tmp_path):
    # "must be real numbers, got dtype bool", though bool images were taken as 0 and 1.
    from tensorboard.backend.event_processing import event_accumulator as ea

    w = BACKENDS[backend](tmp_path)
    w.write_histograms(1, {"h": np.array([True, False, True, True])}, {"h": 2})
    w.close()
    if backend == "jsonl":
        (line,) = writers.read_jsonl(tmp_path / "m.jsonl")
        assert line["h"]["edges"] == [0.0, 0.5, 1.0] and line["h"]["counts"] == [1, 3]
        assert (line["h"]["count"], line["h"]["mean"]) == (4, 0.75)
    if backend == "tensorboard":
        events = ea.EventAccumulator(str(tmp_path))
        events.Reload()
        (event,) = events.Histograms("h")
        assert (event.histogram_value.num, event.histogram_value.sum) == (4.0, 3.0)
        assert list(event.histogram_value.bucket) == [0.0, 1.0, 3.0]


WRAPPERS = {
    "multi": lambda tmp: writers.MultiWriter(
        {"jsonl": writers.JsonlWriter(tmp / "metrics.jsonl"), "tb": writers.TensorBoardWriter(tmp)}
    ),
    "async": lambda tmp: writers.AsyncWriter(writers.JsonlWriter(tmp / "metrics.jsonl")),
    "default set, async": lambda tmp: writers.create_default_writer(
        tmp, console=False, asynchronous=True
    ),
}

# Bad calls that need the values (a wrapper checks shapes alone, not waiting for a device).
_VALUE_CHECKS = {"NaN histogram", "NaN image", "Inf video", "NaN audio"}


class _TorchLike:
    """A CPU tensor as torch's: `__array__`, `shape`, and a dtype NumPy cannot interpret."""

    class dtype:  # noqa: N801  (an instance of it stands for torch.float32)
        def __repr__(self) -> str:
            return "torch.float32"

    def __init__(self, values):
        self._values = np.asarray(values, np.float32)
        self.shape, self.dtype = self._values.shape, _TorchLike.dtype()

    def __array__(self, dtype=None, copy=None):
        return self._values if dtype is None else self._values.astype(dtype)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_wrappers_take_a_tensor_whose_dtype_numpy_cannot_interpret(wrapper, tmp_path):
    # The backends read a torch tensor through __array__, but a wrapper's shape checks
    # raised "Cannot interpret 'torch.float32' as a data type" for images, videos, audio and
    # histograms, as did write_values for a one-element one (create_default_writer's set too).
    from tensorboard.backend.event_processing import event_accumulator as ea

    w = WRAPPERS[wrapper](tmp_path)
    writers.write_values(w, 1, {"loss": _TorchLike([0.5])})
    w.write_histograms(2, {"h": _TorchLike([1.0, 2.0, 2.0])}, {"h": 2})
    w.write_images(2, {"i": _TorchLike(np.ones((2, 2, 3)))})
    w.write_videos(2, {"v": _TorchLike(np.ones((1, 2, 2, 2, 3)))})
    w.write_audios(2, {"a": _TorchLike(np.zeros((1, 4, 1)))}, sample_rate=8000)
    w.close()
    loss, hist, image, video, audio = writers.read_jsonl(tmp_path / "metrics.jsonl")
    assert (loss["step"], loss["loss"]) == (1, 0.5)
    assert (hist["h"]["counts"], hist["h"]["edges"]) == ([1, 2], [1.0, 1.5, 2.0])
    assert (image["i"], video["v"]["shape"]) == (
        {"type": "image", "shape": [2, 2, 3]},
        [1, 2, 2, 2, 3],
    )
    assert audio["a"] == {"type": "audio", "shape": [1, 4, 1], "sample_rate": 8000}
    if wrapper != "async":
        acc = ea.EventAccumulator(str(tmp_path))
        acc.Reload()
        assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 0.5)]
        assert acc.Histograms("h")[0].histogram_value.num == 3


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_wrappers_refuse_bad_input_at_the_call_and_write_none_of_it(wrapper, tmp_path):
    """Shapes, dtypes, texts, rates and bucket counts are refused with the backends' own
    TypeError/ValueError before any wrapped writer runs; NaN in a histogram or image needs
    its values, which each backend reads, so a wrapper reports it as a WriterError."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    w = WRAPPERS[wrapper](tmp_path)
    for name, error, call in BAD_CALLS:
        if name not in _VALUE_CHECKS:
            with pytest.raises(error) as refused:
                call(w)
                pytest.fail(f"{wrapper} accepted {name}")
            assert REFUSED[name] in str(refused.value), name
    with pytest.raises(TypeError, match=r"metadata must be a SummaryMetadata proto.*got int 5"):
        w.write_summaries(1, {"s": np.ones(2)}, {"s": 5})
    with pytest.raises(WriterError, match=r"histogram 'h' has 1 NaN/Inf entries out of 2"):
        w.write_histograms(2, {"h": np.array([np.nan, 1.0])})  # MultiWriter: at the call
        w.flush()  # the async wrappers: here
    with pytest.raises(WriterError, match=r"image 'i' has 1 NaN/Inf values out of 3"):
        w.write_images(2, {"i": np.array([[[np.nan, 0.5, 1.0]]])})
        w.flush()
    w.write_scalars(3, {"ok": 1.0})
    w.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["step"], x["ok"]) for x in lines] == [(3, 1.0)]
    if wrapper != "async":
        acc = ea.EventAccumulator(str(tmp_path))
        acc.Reload()
        assert [(e.step, e.value) for e in acc.Scalars("ok")] == [(3, 1.0)]
        assert acc.Tags()["histograms"] == [] and acc.Tags()["tensors"] == []
