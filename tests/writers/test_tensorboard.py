"""TensorBoardWriter: everything read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import collections
import errno
import glob
import io
import logging
import math
import os
import struct
import subprocess
import sys
import threading
import time
import warnings
import wave
import zlib

import clu.values
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

import writers
from tests.writers.test_jsonl import ODD_HPARAMS, ODD_VALUES
from writers import _encode, _records, plot

_ALL = {ea.SCALARS: 0, ea.TENSORS: 0, ea.IMAGES: 0, ea.AUDIO: 0, ea.HISTOGRAMS: 0}


def _accumulator(logdir) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(logdir), size_guidance=_ALL)
    acc.Reload()
    return acc


def _decode_png(data: bytes) -> np.ndarray:
    """Minimal PNG reader for 8-bit images with filter type 0, to check pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, _, color_type, *_ = header
    channels = {0: 1, 2: 3, 6: 4}[color_type]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    assert not rows[:, 0].any()
    return rows[:, 1:].reshape(height, width, channels)


def test_scalars_of_one_call_are_one_event(tmp_path):
    w = writers.TensorBoardWriter(tmp_path)
    keys = [f"m/{i}" for i in range(50)]
    w.write_scalars(1, {k: float(i) for i, k in enumerate(keys)})
    w.write_scalars(
        2, {"loss": np.float32(0.5), "nan": float("nan"), "inf": np.inf, "n": np.int64(3)}
    )
    w.close()
    (path,) = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
    events = [e for e in EventFileLoader(path).Load() if e.HasField("summary")]
    assert [(e.step, len(e.summary.value)) for e in events] == [(1, 50), (2, 4)]
    acc = _accumulator(tmp_path)
    assert [(s.step, s.value) for s in acc.Scalars("m/7")] == [(1, 7.0)]
    assert [(s.step, s.value) for s in acc.Scalars("loss")] == [(2, 0.5)]
    assert np.isnan(acc.Scalars("nan")[0].value) and acc.Scalars("inf")[0].value == np.inf
    assert acc.Scalars("n")[0].value == 3.0


def test_finite_floats_outside_float32_read_as_the_docstring_says(tmp_path):
    """simple_value is a float32: 1e39 is stored as inf and 1e-46 as 0, as TensorFlow's
    writer stores them (the module docstring says so); JSONL keeps both."""
    w = writers.TensorBoardWriter(tmp_path)
    w.write_scalars(1, {"big": 1e39, "neg": -1e308, "tiny": 1e-46, "sub": 1e-45})
    w.close()
    acc = _accumulator(tmp_path)
    values = {k: acc.Scalars(k)[0].value for k in ("big", "neg", "tiny", "sub")}
    assert values["big"] == math.inf and values["neg"] == -math.inf and values["tiny"] == 0.0
    assert values["sub"] == float(np.float32(1e-45)) > 0  # the least subnormal is kept


def test_texts_images_histograms_audio_and_tensors_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(2, 5, 7, 3), dtype=np.uint8)
    gray = np.array([[0.0, 0.5], [1.0, 0.25]], np.float32)[..., None]
    clip = np.stack([np.linspace(-1, 1, 50), np.zeros(50)], axis=-1)[None]  # [1, T, 2]
    w = writers.TensorBoardWriter(tmp_path)
    w.write_texts(3, {"config": "# Config\n`lr = 0.1`"})
    w.write_images(4, {"rgb": images, "gray": gray})
    w.write_histograms(5, {"h": np.array([0.0, 1.0, 1.0, 2.0, 4.0])}, num_buckets={"h": 4})
    w.write_audios(6, {"a": clip}, sample_rate=8000)
    w.write_summaries(7, {"raw": np.arange(6, dtype=np.int32).reshape(2, 3)})
    w.write_summaries(7, {"bf16": jnp.array([1.5, -2.25], jnp.bfloat16)})  # a number, not a str
    w.write_summaries(7, {"c64": np.array([1 + 2j, -0.5j], np.complex64)})
    frames = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(1, 3, 4, 5, 1) * 4  # each differs
    w.write_videos(8, {"v": frames})
    w.close()
    acc = _accumulator(tmp_path)

    (text,) = acc.Tensors("config")  # CLU's tag; tensorboardX add_text would add /text_summary
    assert text.step == 3 and text.tensor_proto.string_val == [b"# Config\n`lr = 0.1`"]
    # A scalar string, as tf.summary.text writes it: shape [1] was shown as a one-cell table.
    with warnings.catch_warnings():  # html5lib's own DeprecationWarning, on import
        warnings.simplefilter("ignore", DeprecationWarning)
        from tensorboard.plugins.text import text_plugin
    shown = text_plugin.text_array_to_html(tensor_util.make_ndarray(text.tensor_proto), True)
    assert shown == "<h1>Config</h1>\n<p><code>lr = 0.1</code></p>"

    rgb = acc.Tensors("rgb")[0].tensor_proto.string_val
    assert rgb[:2] == [b"7", b"5"] and len(rgb) == 4  # width, height, 2 PNGs
    np.testing.assert_array_equal(_decode_png(rgb[2]), images[0])
    np.testing.assert_array_equal(_decode_png(rgb[3]), images[1])
    gray_png = acc.Tensors("gray")[0].tensor_proto.string_val
    np.testing.assert_array_equal(_decode_png(gray_png[2])[..., 0], [[0, 127], [255, 63]])

    hist = acc.Histograms("h")[0]
    assert hist.step == 5
    value = hist.histogram_value
    assert (value.min, value.max, value.num, value.sum, value.sum_squares) == (
        0.0,
        4.0,
        5,
        8.0,
        22.0,
    )
    assert value.bucket_limit[-4:] == [1.0, 2.0, 3.0, 4.0] and sum(value.bucket) == 5

    (audio,) = acc.Audio("a")
    assert (audio.step, audio.sample_rate, audio.length_frames, audio.content_type) == (
        6,
        8000,
        50,
        "audio/wav",
    )
    with wave.open(io.BytesIO(audio.encoded_audio_string)) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getnframes()) == (2, 8000, 50)
        pcm = np.frombuffer(wav.readframes(50), "<i2").reshape(50, 2)
    np.testing.assert_allclose(pcm / 32767.0, clip[0], atol=1 / 32767)

    raw = acc.Tensors("raw")[0]
    np.testing.assert_array_equal(
        tensor_util.make_ndarray(raw.tensor_proto), np.arange(6).reshape(2, 3)
    )
    bf16 = tensor_util.make_ndarray(acc.Tensors("bf16")[0].tensor_proto)
    assert bf16.dtype == np.float32 and bf16.tolist() == [1.5, -2.25]
    c64 = tensor_util.make_ndarray(acc.Tensors("c64")[0].tensor_proto)
    assert c64.dtype == np.complex64 and c64.tolist() == [1 + 2j, -0.5j]
    video = acc.Tensors("v")[0].tensor_proto.string_val
    assert video[:2] == [b"15", b"4"]  # filmstrip: 3 frames of width 5 side by side
    np.testing.assert_array_equal(_decode_png(video[2]), np.concatenate(list(frames[0]), 1))


def test_a_single_video_without_batch_axis_is_written_as_clu_takes_it(tmp_path):
    # CLU's write_videos takes [T, H, W, C] as well as [N, T, H, W, C]; the first was
    # refused ("must have shape [N, T, H, W, C]"), so a CLU caller's write failed.
    frames = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4, 1) * 8  # [T, H, W, C]
    w = writers.MultiWriter([writers.TensorBoardWriter(tmp_path), writers.JsonlWriter(tmp_path)])
    w.write_videos(2, {"one": frames, "batch": frames[None]})
    w.close()
    acc = _accumulator(tmp_path)
    for key in ("one", "batch"):
        video = acc.Tensors(key)[0].tensor_proto.string_val
        assert video[:2] == [b"8", b"3"] and len(video) == 3  # one filmstrip of 2 frames
        np.testing.assert_array_equal(_decode_png(video[2]), np.concatenate(list(frames), 1))
    (line,) = writers.read_jsonl(tmp_path / "metrics.jsonl")
    assert line["one"] == line["batch"] == {"type": "video", "shape": [1, 2, 3, 4, 1]}


def test_big_endian_tensors_read_back_as_the_same_numbers(tmp_path):
    # Arrays from a file in network byte order: their bytes went out as they were, and
    # TensorBoard read [1.0, 2.0] as [4.6e-41, 9.0e-44], [1, 258] as [16777216, 33619968].
    w = writers.TensorBoardWriter(tmp_path)
    w.write_summaries(1, {"f": np.array([1.0, 2.0], ">f4"), "i": np.array([1, 258], ">i4")})
    w.close()
    acc = _accumulator(tmp_path)
    f = tensor_util.make_ndarray(acc.Tensors("f")[0].tensor_proto)
    i = tensor_util.make_ndarray(acc.Tensors("i")[0].tensor_proto)
    assert (f.dtype, f.tolist()) == (np.float32, [1.0, 2.0])
    assert (i.dtype, i.tolist()) == (np.int32, [1, 258])


def test_longdouble_tensors_are_written_as_float64_numbers_as_jsonl_writes_them(tmp_path):
    # TensorFlow has no 80-bit float: they became a string tensor [b'1.5', b'0.25'].
    w = writers.TensorBoardWriter(tmp_path)
    w.write_summaries(1, {"x": np.array([1.5, 0.25], np.longdouble)})
    w.write_summaries(1, {"z": np.array([1 + 0.5j], np.clongdouble)})
    w.close()
    acc = _accumulator(tmp_path)
    x = tensor_util.make_ndarray(acc.Tensors("x")[0].tensor_proto)
    z = tensor_util.make_ndarray(acc.Tensors("z")[0].tensor_proto)
    assert (x.dtype, x.tolist()) == (np.float64, [1.5, 0.25])
    assert (z.dtype, z.tolist()) == (np.complex128, [1 + 0.5j])


def test_string_tensors_with_lone_surrogates_are_written_escaped_as_texts_are(tmp_path):
    # A file name from os.fsdecode in a string tensor raised a bare UnicodeEncodeError that
    # named no key; write_texts had escaped the same str.
    w = writers.TensorBoardWriter(tmp_path)
    w.write_summaries(1, {"files": np.array(["/data/caf\udce9", "ok"]), "one": "b\ud800"})
    w.close()
    acc = _accumulator(tmp_path)
    files = tensor_util.make_ndarray(acc.Tensors("files")[0].tensor_proto)
    assert files.tolist() == [b"/data/caf\\udce9", b"ok"]
    assert acc.Tensors("one")[0].tensor_proto.string_val == [b"b\\ud800"]


def test_a_long_double_histogram_past_float64_is_refused_as_inf_by_every_writer(tmp_path):
    # 1e4000 is finite as a long double but inf in the float64 bins: TensorBoard got 29 edges
    # of inf, and JSONL "Out of range float values are not JSON compliant", naming no key.
    h = np.array([np.longdouble("1e4000"), 1.0, np.longdouble("-1e4000")], np.longdouble)
    tb, jsonl = writers.TensorBoardWriter(tmp_path), writers.JsonlWriter(tmp_path)
    for w in (tb, jsonl):
        with pytest.raises(ValueError, match=r"histogram 'h' has 2 NaN/Inf entries out of 3;"):
            w.write_histograms(1, {"h": h})
        w.write_histograms(2, {"h": h[1:2]})
        w.close()
    hist = _accumulator(tmp_path).Histograms("h")
    assert [(e.step, e.histogram_value.num, e.histogram_value.max) for e in hist] == [(2, 1, 1.0)]
    [line] = writers.read_jsonl(jsonl.path)
    assert (line["step"], line["h"]["count"], line["h"]["max"]) == (2, 1, 1.0)


def test_a_key_named_as_another_keys_clip_tag_is_refused_and_nothing_of_the_call_written(
    tmp_path,
):
    # A 2-clip 'sample' is tagged sample/0 and sample/1: a 1-clip 'sample/0' went under the
    # same tag at the same step, mixed with no error.
    w = writers.TensorBoardWriter(tmp_path)
    clips = {"sample": np.full((2, 800, 1), 0.1), "sample/0": np.full((1, 800, 1), 0.9)}
    with pytest.raises(ValueError, match=r"clips would be tagged \['sample/0'\] twice"):
        w.write_audios(1, clips, sample_rate=8000)
    w.write_audios(2, {"sample": clips["sample"], "other": clips["sample/0"]}, sample_rate=8000)
    w.close()
    acc = _accumulator(tmp_path)
    tags = {t: [e.step for e in acc.Audio(t)] for t in acc.Tags()["audio"]}
    assert tags == {"sample/0": [2], "sample/1": [2], "other": [2]}


def test_clips_past_a_wav_header_are_refused_and_its_limits_read_back(tmp_path):
    # wave's struct.error ("ushort format requires 0 <= number <= 65535") for a [N, C, T]
    # clip of 3 s at 16 kHz, and ("'L' format requires ...") for a mono rate of 2**31.
    # A [N, C, T] clip of 1 s was written as a WAV of 16,000 channels of 1 sample.
    w = writers.TensorBoardWriter(tmp_path)
    with pytest.raises(ValueError, match=r"'a' has 48000 channels .*np.moveaxis\(x, -1, -2\)"):
        w.write_audios(0, {"a": np.zeros((1, 1, 48000))}, sample_rate=16000)
    for shape, samples in (((1, 1, 16000), "1 sample"), ((2, 2, 16000), "2 samples")):
        with pytest.raises(ValueError) as err:
            w.write_audios(0, {"a": np.zeros(shape)}, sample_rate=16000)
        assert str(err.value) == (
            f"TensorBoardWriter.write_audios: audio 'a' has 16000 channels (shape {shape}, [N, T, "
            f"C]); more than its {samples} per channel. Move the channel axis last for clips of "
            "shape [N, C, T] (torchaudio's): np.moveaxis(x, -1, -2)."
        )
    with pytest.raises(ValueError, match=r"sample_rate 2147483648 is too high .* of \['a'\]"):
        w.write_audios(0, {"a": np.zeros((1, 4, 1))}, sample_rate=2**31)
    w.write_audios(1, {"mono": np.full((1, 2, 1), 0.5)}, sample_rate=2**31 - 1)
    w.close()
    (audio,) = _accumulator(tmp_path).Audio("mono")
    # The most channels a WAV holds (only a clip of as many samples reaches the encoder).
    wide = _encode.wav(np.full((2, 2**15 - 1), -0.5), 8000)
    for data, rate, channels, sample in (
        (audio.encoded_audio_string, 2**31 - 1, 1, 16384),
        (wide, 8000, 32767, -16384),
    ):
        with wave.open(io.BytesIO(data)) as wav:
            assert (wav.getframerate(), wav.getnchannels(), wav.getnframes()) == (rate, channels, 2)
            assert set(np.frombuffer(wav.readframes(2), "<i2").tolist()) == {sample}


def test_a_key_written_as_another_kind_is_kept_and_warned_about_once(tmp_path, caplog):
    # TensorBoard files a tag under its first value's plugin: a text, histogram or image
    # written later under a scalar's key was in the file, but on no dashboard, with no word.
    w = writers.TensorBoardWriter(tmp_path)
    w.write_scalars(1, {"x": 1.0})
    w.write_audios(1, {"a": np.zeros((2, 3, 1))}, sample_rate=8000)  # tags a/0 and a/1
    with caplog.at_level(logging.WARNING):
        for step in (2, 3):  # warned at step 2 alone
            w.write_texts(step, {"x": "hi", "t": "a text"})
            w.write_histograms(step, {"x": np.arange(3.0)})
            w.write_images(step, {"x": np.ones((1, 1, 1)), "i": np.ones((1, 1, 1))})
            w.write_scalars(step, {"a/1": 1.0, "x": float(step)})
    w.write_videos(4, {"i": np.ones((1, 1, 1, 1, 1))})  # a filmstrip: an image too
    w.close()
    warned = [r.getMessage() for r in caplog.records if "on no dashboard" in r.getMessage()]
    assert [m.split(": tags ")[1].split(";")[0] for m in warned] == [
        "['x'] were first written as ['scalars']",
        "['x'] were first written as ['scalars']",
        "['x'] were first written as ['scalars']",
        "['a/1'] were first written as ['audio']",
    ]
    assert "these texts are in the event file" in warned[0]
    acc = pea.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    shown = {p: sorted(acc.PluginTagToContent(p)) for p in acc.ActivePlugins()}
    assert shown == {"scalars": ["x"], "audio": ["a/0", "a/1"], "text": ["t"], "images": ["i"]}
    ranks = collections.Counter(len(e.tensor_proto.tensor_shape.dim) for e in acc.Tensors("x"))
    # 3 scalars, and 2 each of texts (rank 0 strings too), images and histograms: all kept
    assert ranks == {0: 5, 1: 2, 2: 2}
    scalars = [(e.step, e.tensor_proto.float_val) for e in acc.Tensors("x")
               if e.tensor_proto.float_val and not e.tensor_proto.tensor_shape.dim]  # fmt: skip
    assert scalars == [(1, [1.0]), (2, [2.0]), (3, [3.0])]
    assert [e.step for e in acc.Tensors("i")] == [2, 3, 4]


def test_a_raw_tensor_under_a_key_of_another_kind_is_warned_about_like_the_others(tmp_path, caplog):
    # write_summaries checked no kind: a tensor of shape [3] joined the scalar series of 'x'
    # with no word. A tensor without a plugin claims no tag ('y' stays a text tag).
    from tensorboard.compat.proto import summary_pb2

    plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
    text = summary_pb2.SummaryMetadata(plugin_data=plugin)
    w = writers.TensorBoardWriter(tmp_path)
    w.write_scalars(1, {"x": 1.0})
    with caplog.at_level(logging.WARNING):
        w.write_summaries(2, {"x": np.ones(3), "y": np.ones(2)})
        w.write_texts(3, {"y": "a text"})
        w.write_summaries(3, {"t": np.array("markdown", object)}, {"t": text})
        w.write_texts(4, {"t": "more"})  # the same kind: no word
        w.write_scalars(4, {"t": 2.0})
    w.close()
    warned = [r.getMessage() for r in caplog.records if "on no dashboard" in r.getMessage()]
    assert [m.split(": tags ")[1].split(", so")[0] for m in warned] == [
        "['x'] were first written as ['scalars']; TensorBoard shows a tag as the kind first "
        "written to it",
        "['t'] were first written as ['texts']; TensorBoard shows a tag as the kind first "
        "written to it",
    ]
    assert ".write_summaries: " in warned[0] and "these tensors are" in warned[0]
    acc = pea.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    shown = {p: sorted(acc.PluginTagToContent(p)) for p in acc.ActivePlugins()}
    assert shown == {"scalars": ["x"], "text": ["t", "y"]}
    assert [(e.step, len(e.tensor_proto.tensor_shape.dim)) for e in acc.Tensors("x")] == [
        (1, 0),
        (2, 1),
    ]


def test_a_raw_tensor_before_a_key_is_claimed_is_warned_about_when_it_is(tmp_path, caplog):
    # A plugin-less tensor first, then a histogram of that key: TensorBoard read the tensor of
    # shape [2] as the histogram at step 1, with no word (the opposite order was warned about).
    w = writers.TensorBoardWriter(tmp_path)
    with caplog.at_level(logging.WARNING):
        w.write_summaries(1, {"h": np.ones(2), "r": np.ones(2)})
        w.write_histograms(2, {"h": np.arange(10.0)})
        w.write_histograms(3, {"h": np.arange(10.0)})  # warned once per tag
        w.write_summaries(3, {"r": np.ones(2)})  # never claimed: no word
    w.close()
    warned = [r.getMessage() for r in caplog.records if "without a plugin" in r.getMessage()]
    assert len(warned) == 1
    assert (
        ".write_histograms: tags ['h'] already hold tensors of write_summaries without a "
        "plugin, which TensorBoard now reads as histograms: a dashboard shows them wrong"
    ) in warned[0]
    acc = pea.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    acc.Reload()
    assert sorted(acc.PluginTagToContent("histograms")) == ["h"]
    shapes = [(e.step, [d.size for d in e.tensor_proto.tensor_shape.dim]) for e in acc.Tensors("h")]
    assert shapes == [(1, [2]), (2, [30, 3]), (3, [30, 3])]


def test_bfloat16_images_histograms_and_audio_are_written_as_float32_ones(tmp_path):
    """A mixed-precision model's outputs: bfloat16 holds exactly in float32."""
    gray = jnp.array([[0.0, 0.5], [1.0, 0.25]], jnp.bfloat16)[..., None]
    w = writers.TensorBoardWriter(tmp_path)
    w.write_images(1, {"gray": gray})
    w.write_histograms(1, {"h": jnp.array([0.0, 1.0, 1.0, 2.0, 4.0], jnp.bfloat16)})
    w.write_audios(1, {"a": jnp.full((1, 20, 1), 0.5, jnp.bfloat16)}, sample_rate=8000)
    w.close()
    acc = _accumulator(tmp_path)
    png = acc.Tensors("gray")[0].tensor_proto.string_val[2]
    np.testing.assert_array_equal(_decode_png(png)[..., 0], [[0, 127], [255, 63]])
    value = acc.Histograms("h")[0].histogram_value
    assert (value.min, value.max, value.num, value.sum) == (0.0, 4.0, 5, 8.0)
    assert acc.Audio("a")[0].length_frames == 20


def test_floats_outside_the_media_range_are_clipped_as_documented_and_warned_once_per_key(
    tmp_path, caplog
):
    """Images in [0, 255] or [-1, 1] as floats (a common slip) draw white or black pixels,
    loud audio clips; the writers that encode them say so once per key, the ones that only
    log shapes do not. Integer audio (PCM) is refused: read as floats it would be noise."""
    images = {
        "bytes_as_floats": np.full((2, 2, 1), 200.0),
        "signed": np.array([[-1.0, 0.0], [0.5, 1.0]])[..., None],
        "unit": np.array([[0.0, 0.5], [1.0, 1.0000001]])[..., None],  # rounding: no warning
        "uint8": np.full((2, 2, 1), 200, np.uint8),
        "depth": np.array([[0, 255], [256, 65535]], np.uint16)[..., None],  # 16-bit pixels
        "int32": np.array([[0, 7], [128, 255]], np.int32)[..., None],  # in [0, 255]: no warning
    }
    tb, log = writers.TensorBoardWriter(tmp_path), writers.JsonlWriter(tmp_path / "m.jsonl")
    for w in (tb, log):
        w.write_images(1, images)
        w.write_images(2, {"bytes_as_floats": images["bytes_as_floats"]})
        w.write_videos(3, {"clip": np.full((1, 2, 2, 2, 3), 3.0)})
        w.write_audios(
            4, {"loud": np.full((1, 4, 1), 2.0), "full": -np.ones((1, 4, 1))}, sample_rate=8
        )
        with pytest.raises(ValueError, match=r"audio 'pcm' must be a float .* x / 32768"):
            w.write_audios(5, {"pcm": np.ones((1, 4, 1), np.int16)}, sample_rate=8)
        w.close()
    warned = [r.getMessage() for r in caplog.records if "clipped" in r.getMessage()]
    assert [m.split(" holds")[0] for m in warned] == [
        "TensorBoardWriter: float image 'bytes_as_floats'",
        "TensorBoardWriter: float image 'signed'",
        "TensorBoardWriter: integer image 'depth'",
        "TensorBoardWriter: float video 'clip'",
        "TensorBoardWriter: float audio 'loud'",
    ]
    assert "[200, 200], but is read in [0, 1]" in warned[0] and "x / 255" in warned[0]
    assert "[-1, 1], but is read in [0, 1]" in warned[1]
    assert "[0, 65535], but is read in [0, 255]" in warned[2] and "x // 257" in warned[2]
    assert "[2, 2], but is read in [-1, 1]" in warned[4]
    acc = _accumulator(tmp_path)
    pixels = {k: _decode_png(acc.Tensors(k)[0].tensor_proto.string_val[2])[..., 0] for k in images}
    np.testing.assert_array_equal(pixels["bytes_as_floats"], np.full((2, 2), 255))  # clipped
    np.testing.assert_array_equal(pixels["signed"], [[0, 0], [127, 255]])
    np.testing.assert_array_equal(pixels["unit"], [[0, 127], [255, 255]])
    np.testing.assert_array_equal(pixels["uint8"], np.full((2, 2), 200))
    np.testing.assert_array_equal(pixels["depth"], [[0, 255], [255, 255]])
    np.testing.assert_array_equal(pixels["int32"], [[0, 7], [128, 255]])
    with wave.open(io.BytesIO(acc.Audio("loud")[0].encoded_audio_string)) as wav:
        assert list(np.frombuffer(wav.readframes(4), "<i2")) == [32767] * 4  # clipped to 1


def test_odd_values_are_written_as_every_writer_writes_them(tmp_path):
    w = writers.TensorBoardWriter(tmp_path)
    w.write_hparams(ODD_HPARAMS)
    w.write_texts(1, {"t": ODD_HPARAMS["data"]})
    w.write_scalars(1, {"q/last": ODD_VALUES["q"][1]})  # TensorBoard shows a tag as one kind
    w.write_summaries(1, {"q": ODD_VALUES["q"]})
    w.write_histograms(1, ODD_VALUES)
    w.close()
    acc = _accumulator(tmp_path)
    content = acc.PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = {k: v.string_value for k, v in data.session_start_info.hparams.items()}
    assert hp == {
        "opt": "adam",
        "budget": "90 seconds",
        "shift": "(1+2j)",
        "data": "/data/caf\\udce9",
    }
    assert acc.Tensors("t")[0].tensor_proto.string_val == [b"/data/caf\\udce9"]
    assert acc.Scalars("q/last")[0].value == -2.0
    q = tensor_util.make_ndarray(acc.Tensors("q")[0].tensor_proto)
    assert q.dtype == np.int8 and q.tolist() == [3, -2]
    hist = acc.Histograms("almost_constant")[0].histogram_value
    assert (hist.num, hist.min, hist.max, sum(hist.bucket)) == (2, 0.3, 0.1 + 0.2, 2.0)
    assert hist.bucket_limit[-1] == 0.1 + 0.2


def test_a_constant_histogram_has_the_bucket_every_writer_gives_it(tmp_path):
    """tensorboardX's 30 buckets put [3.0] * 10 in (3.0, 3.033], above the value, while
    JSONL, MLflow and W&B write one bucket [2.5, 3.5] around it: the same bucket now."""
    tb, jsonl = writers.TensorBoardWriter(tmp_path), writers.JsonlWriter(tmp_path)
    arrays = {"c": np.full(10, 3.0), "spread": np.arange(4.0)}
    for w in (tb, jsonl):
        w.write_histograms(1, arrays, num_buckets={"spread": 3})
        w.close()
    acc = _accumulator(tmp_path)
    [line] = writers.read_jsonl(jsonl.path)
    assert line["c"]["edges"] == [2.5, 3.5] and line["c"]["counts"] == [10]
    constant = acc.Histograms("c")[0].histogram_value
    # TensorBoard keeps right edges, with an empty bucket before the first: (2.5, 3.5].
    assert list(constant.bucket_limit) == [2.5, 3.5] and list(constant.bucket) == [0, 10]
    spread = acc.Histograms("spread")[0].histogram_value
    assert line["spread"]["edges"] == [0.0, 1.0, 2.0, 3.0] and line["spread"]["counts"] == [1, 1, 2]
    assert list(spread.bucket_limit) == [0.0, 1.0, 2.0, 3.0]
    assert list(spread.bucket) == [0, 1, 1, 2]


def test_hparams_reach_the_hparams_plugin(tmp_path):
    w = writers.TensorBoardWriter(tmp_path)
    w.write_hparams(
        {"lr": 0.1, "optimizer": "adam", "layers": np.int64(4), "dropout": True, "shape": (2, 3)}
        | {"bias": np.bool_(False), "adam": {"b1": 0.9, "eps": {"value": 1e-8}}}
        | {"warmup": jnp.int32(100), "wd": jnp.asarray(0.25, jnp.bfloat16)}
    )
    w.close()
    content = _accumulator(tmp_path).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = data.session_start_info.hparams
    assert hp["lr"].number_value == 0.1 and hp["layers"].number_value == 4.0
    assert hp["optimizer"].string_value == "adam" and hp["dropout"].bool_value is True
    assert hp["shape"].string_value == "(2, 3)"
    assert hp["adam.b1"].number_value == 0.9 and hp["adam.eps.value"].number_value == 1e-8
    assert hp["bias"].WhichOneof("kind") == "bool_value" and hp["bias"].bool_value is False
    assert hp["warmup"].number_value == 100.0 and hp["wd"].number_value == 0.25


def test_a_list_of_numpy_numbers_is_written_as_the_readme_shows_a_list(tmp_path):
    # NumPy 2 writes its scalars' repr in a list: "[np.int64(64), np.int64(32)]".
    hparams = {"layers": [np.int64(64), np.int64(32)], "betas": (np.float32(0.5), 0.999)}
    tb, jsonl = writers.TensorBoardWriter(tmp_path), writers.JsonlWriter(tmp_path)
    for w in (tb, jsonl):
        w.write_hparams(hparams)
        w.close()
    content = _accumulator(tmp_path).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    shown = {k: v.string_value for k, v in data.session_start_info.hparams.items()}
    assert shown == {"layers": "[64, 32]", "betas": "(0.5, 0.999)"}
    assert writers.read_jsonl(jsonl.path)[0]["hparams"] == shown


def test_an_hparam_int_of_5000_digits_is_refused_by_its_name(tmp_path):
    # JSONL named 'hparam', as a scalar; TensorBoard raised CPython's own message, no key.
    for writer in (writers.JsonlWriter(tmp_path), writers.TensorBoardWriter(tmp_path)):
        with pytest.raises(ValueError) as info:
            writer.write_hparams({"opt": {"seed": 10**5000}, "lr": 0.1})
        assert str(info.value) == (
            f"{type(writer).__name__}.write_hparams: hyperparameter 'opt.seed' is an int of "
            "more than 4300 digits, which Python refuses to turn into text, as the writers do; "
            "pass float(value) (inf past 1.8e308), or raise sys.set_int_max_str_digits()"
        )
        writer.write_hparams({"seed": 10**400})  # 400 digits: written (inf in TensorBoard)
        writer.close()
    assert [line["hparams"] for line in writers.read_jsonl(tmp_path)] == [{"seed": 10**400}]
    content = _accumulator(tmp_path).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert list(data.session_start_info.hparams) == ["seed"]
    assert data.session_start_info.hparams["seed"].number_value == math.inf


def test_hparams_tensorboard_cannot_show_are_warned_about_and_an_empty_call_hides_none(
    tmp_path, caplog
):
    # The HParams tab shows a run's first session alone: later calls' keys vanished with no
    # word, and write_hparams({}) hid every later call.
    w = writers.TensorBoardWriter(tmp_path)
    with caplog.at_level(logging.WARNING):
        w.write_hparams({})
        w.write_hparams({"lr": 0.1, "warmup": jnp.int32(100), "shape": np.zeros(2)})
        w.write_hparams({"lr": 0.1, "warmup": jnp.int32(100), "shape": np.zeros(2)})  # the same
        w.write_hparams({"batch": 32, "lr": 0.2})
        w.write_hparams({"seed": 1})
    w.close()
    content = _accumulator(tmp_path).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert sorted(data.session_start_info.hparams) == ["lr", "shape", "warmup"]
    warned = [r.getMessage() for r in caplog.records if "HParams tab" in r.getMessage()]
    assert warned == [
        f"TensorBoardWriter({tmp_path}): TensorBoard's HParams tab shows the first "
        "write_hparams of a run alone; ['batch', 'lr'] of a later one are not shown there (the "
        "other writers have them). Write every hyperparameter in one call. Warned once."
    ]


def test_hparams_equal_as_written_are_not_warned_about_and_a_changed_one_is(tmp_path, caplog):
    # Values were compared by repr(): 0.1 then np.float64(0.1) (repr "np.float64(0.1)"), 1
    # then np.int32(1), NaN then np.float32 NaN were warned about as not shown, though
    # TensorBoard holds the same value for each.
    w = writers.TensorBoardWriter(tmp_path)
    with caplog.at_level(logging.WARNING):
        w.write_hparams({"lr": 0.1, "n": 1, "eps": math.nan})
        w.write_hparams({"lr": np.float64(0.1), "n": np.int32(1), "eps": np.float32("nan")})
        assert [r for r in caplog.records if "HParams tab" in r.getMessage()] == []
        w.write_hparams({"lr": np.float64(0.2), "n": 1.0})
    w.close()
    warned = [r.getMessage() for r in caplog.records if "HParams tab" in r.getMessage()]
    assert warned == [
        f"TensorBoardWriter({tmp_path}): TensorBoard's HParams tab shows the first "
        "write_hparams of a run alone; ['lr'] of a later one are not shown there (the "
        "other writers have them). Write every hyperparameter in one call. Warned once."
    ]


def test_nonfinite_hparams_are_kept_without_tensorboardx_s_keyless_warning(tmp_path, caplog):
    w = writers.TensorBoardWriter(tmp_path)
    with caplog.at_level(logging.WARNING):
        w.write_hparams({"lr": float("nan"), "clip": np.float32(np.inf), "wd": -math.inf, "b": 2})
    w.close()
    assert [r.getMessage() for r in caplog.records] == []  # was "NaN or Inf found ..." x3
    content = _accumulator(tmp_path).PluginTagToContent("hparams")
    data = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = data.session_start_info.hparams
    assert math.isnan(hp["lr"].number_value) and hp["clip"].number_value == math.inf
    assert hp["wd"].number_value == -math.inf and hp["b"].number_value == 2.0


_SHORT_WRITE = """
import os, resource, signal, sys
import writers
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not death
tb = writers.TensorBoardWriter(sys.argv[1])
jsonl = writers.JsonlWriter(os.path.join(sys.argv[1], "metrics.jsonl"))
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
extra = {f"layer_{i:04d}/grad_norm": 0.25 for i in range(int(sys.argv[2]))}
for step in range(1, 11):
    for w in (tb, jsonl):
        if step == 6:  # the disk fills: the kernel takes 20 bytes of the next write, then none
            limit = os.path.getsize(w.path) + 20
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
        try:
            w.write_scalars(step, {"loss": float(step), "accuracy": 0.5, **extra})
        except OSError as err:
            print(type(w).__name__, step, err.errno)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again
tb.close()
jsonl.close()
"""


# 1,000 more keys make a JSONL line of about 30 KB, past Python's 8 KiB buffer: the disk's
# short write of it lost the rest of the line, and the next line was glued onto the fragment.
@pytest.mark.parametrize("extra_keys", [0, 1000])
def test_a_write_the_disk_takes_only_part_of_leaves_no_torn_record(tmp_path, extra_keys):
    # A torn record makes TensorBoard's reader drop every later event of the file.
    out = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE, str(tmp_path), str(extra_keys)],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    ).stdout
    assert f"TensorBoardWriter 6 {errno.EFBIG}" in out.splitlines()  # refused, not torn
    assert [e.step for e in _accumulator(tmp_path).Scalars("loss")] == [1, 2, 3, 4, 5, 7, 8, 9, 10]
    # JSONL's buffered file writes the rest of the line once there is space again.
    jsonl = writers.read_jsonl(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in jsonl] == list(range(1, 11))
    assert [len(line) for line in jsonl] == [3 + 2 + extra_keys] * 10  # step, time, values
    assert [line["loss"] for line in jsonl] == [float(step) for step in range(1, 11)]


def test_purge_step_hides_stale_events_on_resume(tmp_path):
    first = writers.TensorBoardWriter(tmp_path)
    for step in range(10):
        first.write_scalars(step, {"loss": float(step)})
    first.close()
    # Event files are read in name order; a new file takes a later second than any there,
    # so the resumed file sorts after the first one even within the same second.
    resumed = writers.TensorBoardWriter(tmp_path, purge_step=5, filename_suffix=".resumed")
    for step in (5, 6):
        resumed.write_scalars(step, {"loss": 100.0 + step})
    resumed.close()
    loss = [(s.step, s.value) for s in _accumulator(tmp_path).Scalars("loss")]
    assert loss == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 105.0), (6, 106.0)]


def test_the_rust_data_server_drops_a_tags_stale_steps_only_when_it_is_written_again(tmp_path):
    # TensorBoard's default reader ignores the restart that purge_step writes (the README says
    # so): "eval", not written after the resume, keeps its step 8 there.
    import grpc  # tensorboard's own dependencies, as its default reader
    import tensorboard_data_server
    from tensorboard import context
    from tensorboard.data import grpc_provider
    from tensorboard.data.proto import data_provider_pb2_grpc

    first = writers.TensorBoardWriter(tmp_path / "train")
    for step in range(10):
        first.write_scalars(step, {"loss": float(step), **({"eval": 0.5} if step == 8 else {})})
    first.close()
    resumed = writers.TensorBoardWriter(tmp_path / "train", purge_step=5)
    resumed.write_scalars(5, {"loss": 105.0})
    resumed.close()
    port_file = tmp_path / "port"
    args = ["--logdir", str(tmp_path), "--port", "0", "--port-file", str(port_file)]
    server = tensorboard_data_server.server_binary()
    proc = subprocess.Popen([server, *args, "--die-after-stdin"], stdin=subprocess.PIPE)
    try:
        for _ in range(600):  # the server writes its port once it listens
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.05)
        address = f"localhost:{int(port_file.read_text())}"
        stub = data_provider_pb2_grpc.TensorBoardDataProviderStub(grpc.insecure_channel(address))
        provider = grpc_provider.GrpcDataProvider(address, stub)
        read: dict = {}
        for _ in range(1200):  # until both files are loaded (60 s on a loaded machine)
            runs = provider.read_scalars(
                context.RequestContext(), experiment_id="", plugin_name="scalars", downsample=99
            )
            read = {t: [(p.step, p.value) for p in v] for t, v in runs.get("train", {}).items()}
            if "eval" in read and read["loss"][-1:] == [(5, 105.0)]:
                break
            time.sleep(0.05)
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert read["loss"] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 105.0)]
    assert read["eval"] == [(8, 0.5)]


@pytest.mark.parametrize("suffix", ["", ".train"])
def test_writers_made_in_the_same_second_read_in_the_order_they_were_made(tmp_path, suffix):
    # A counter after the host ("<host>.1.train") sorted before the first file's
    # "<host>.train", and ".10" before ".2": TensorBoard read the resumed run's events
    # first, then the stale ones, and nothing was purged.
    first = writers.TensorBoardWriter(tmp_path, filename_suffix=suffix)
    for step in range(1, 11):
        first.write_scalars(step, {"loss": float(step)})
    first.close()
    for resume in range(11):  # 11 more files, most of them in one second
        w = writers.TensorBoardWriter(tmp_path, purge_step=6, filename_suffix=suffix)
        for step in (6, 7, 8):
            w.write_scalars(step, {"loss": 100.0 * (resume + 1) + step})
        w.close()
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 12 and all(n.endswith(suffix) for n in names)
    assert [int(n.split(".")[3]) for n in names] == sorted({int(n.split(".")[3]) for n in names})
    loss = [(s.step, s.value) for s in _accumulator(tmp_path).Scalars("loss")]
    assert loss == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)] + [
        (step, 1100.0 + step) for step in (6, 7, 8)
    ]
    (series,) = plot.load_series([str(tmp_path)], ["loss"])[1]  # it reads in name order too
    assert list(zip(series.steps.tolist(), series.values.tolist(), strict=True)) == loss


def test_a_replacement_on_another_host_in_the_same_second_reads_after_the_stale_events(
    monkeypatch,
):
    # On a URL the name held the start second, then the host: a replacement made in the
    # same second on "worker-a" sorted before the preempted run's "worker-b" parts, so
    # TensorBoard read its purge first and the stale steps 6-10 after it, shown again.
    import fsspec

    url, now, fs = "memory://tb-hosts/run", time.time(), fsspec.filesystem("memory")
    runs = [("worker-b", None, range(1, 11), 0.0), ("worker-a", 6, (6, 7), 100.0)]
    for host, purge_step, steps, offset in runs:
        monkeypatch.setattr(_records.socket, "gethostname", lambda host=host: host)
        monkeypatch.setattr(_records.time, "time", lambda: now)
        w = writers.TensorBoardWriter(url, purge_step=purge_step)
        for step in steps:
            w.write_scalars(step, {"loss": offset + step})
        w.close()
    monkeypatch.undo()
    loss = [(s.step, s.value) for s in _accumulator(url).Scalars("loss")]
    assert loss == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, 106.0), (7, 107.0)]
    names = sorted(fs.ls("/tb-hosts/run", detail=False))
    seconds_and_hosts = [n.rsplit("/", 1)[1].split(".")[3:5] for n in names]
    assert seconds_and_hosts == [[str(int(now)), "worker-b"], [str(int(now) + 1), "worker-a"]]
    fs.rm("/tb-hosts", recursive=True)


def test_every_event_reaches_the_file_when_written_and_the_timer_fsyncs(tmp_path):
    slow = writers.TensorBoardWriter(tmp_path / "slow", flush_secs=3600)
    slow.write_scalars(0, {"a": 1.0})
    # Unbuffered: readable before any flush, so a killed process loses nothing written.
    assert [s.value for s in _accumulator(tmp_path / "slow").Scalars("a")] == [1.0]
    slow.flush()
    slow.close()

    timed = writers.TensorBoardWriter(tmp_path / "timed", flush_secs=0.01)
    timed.write_scalars(0, {"a": 2.0})
    deadline = time.monotonic() + 30
    while "a" not in _accumulator(tmp_path / "timed").Tags()["scalars"]:
        assert time.monotonic() < deadline, "the flush timer never flushed"
        time.sleep(0.01)
    timed.close()


def test_bad_input_raises_and_nothing_written_is_lost(tmp_path):
    w = writers.TensorBoardWriter(tmp_path)
    w.write_scalars(1, {"loss": 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        w.write_scalars(-1, {"loss": 2.0})
    with pytest.raises(TypeError, match="step must be a non-negative integer"):
        w.write_scalars(1.5, {"loss": 2.0})
    with pytest.raises(TypeError, match=r"every key must be a str, got 1 \(int\)"):
        w.write_scalars(2, {1: 2.0})
    with pytest.raises(ValueError) as info:
        w.write_images(
            2, {"flat": np.zeros((4, 4)), "five": np.zeros((2, 2, 5)), "ok": np.zeros((2, 2, 3))}
        )
    assert (
        "2 problems" in str(info.value)
        and "'flat'" in str(info.value)
        and "'five'" in str(info.value)
    )
    with pytest.raises(ValueError, match="NaN/Inf"):
        w.write_histograms(2, {"h": np.array([np.nan, 1.0])})
    with pytest.raises(ValueError, match="empty"):
        w.write_histograms(2, {"h": np.zeros(0)})
    with pytest.raises(TypeError, match="text 't' must be a str, got int 3; convert with str"):
        w.write_texts(2, {"t": 3})
    with pytest.raises(ValueError, match="flush_secs must be positive"):
        writers.TensorBoardWriter(tmp_path / "other", flush_secs=0)
    with pytest.raises(ValueError, match="non-negative"):
        writers.TensorBoardWriter(tmp_path / "other", purge_step=-1)
    w.close()
    w.close()
    with pytest.raises(writers.WriterClosedError, match="TensorBoardWriter.write_scalars"):
        w.write_scalars(3, {"loss": 3.0})
    acc = _accumulator(tmp_path)
    assert [(s.step, s.value) for s in acc.Scalars("loss")] == [(1, 1.0)]
    assert acc.Tags()["tensors"] == [] and acc.Tags()["histograms"] == []


def test_event_crc_is_the_native_crc32c():
    # tensorboardX falls back to a byte-at-a-time Python CRC when the `crc32c`
    # package is missing, which costs more than half of a 50-scalar write.
    import crc32c
    import tensorboardX.crc32c

    assert tensorboardX.crc32c.crc32c is crc32c.crc32c
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    crc = 0xE3069283
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert _records.masked_crc32c(b"123456789") == masked


def test_two_writers_in_one_directory_never_overwrite_each_other(tmp_path):
    first = writers.TensorBoardWriter(tmp_path)
    second = writers.TensorBoardWriter(tmp_path)
    assert first.path != second.path
    first.write_scalars(1, {"a": 1.0})
    second.write_scalars(2, {"b": 2.0})
    first.close()
    second.close()
    tags = _accumulator(tmp_path).Tags()["scalars"]
    assert sorted(tags) == ["a", "b"]


def test_hand_encoded_scalar_event_is_what_protobuf_serializes():
    from tensorboardX.proto import event_pb2, summary_pb2

    from writers import _tb_summary

    numbers = {"loss": 0.5, "é/ü": float("nan"), "x" * 200: np.inf, "big": 1e39, "i": 3, "z": -0.0}
    encoded = _tb_summary.scalar_event(2**40 + 3, numbers)
    event = event_pb2.Event.FromString(encoded)
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in numbers.items()]
    expected = event_pb2.Event(
        step=2**40 + 3, wall_time=event.wall_time, summary=summary_pb2.Summary(value=values)
    )
    assert encoded == expected.SerializeToString()
    assert event.summary.value[3].simple_value == np.inf  # 1e39 overflows float32, as in protobuf


@settings(max_examples=60, deadline=None)
@given(
    step=st.integers(0, 2**62),
    numbers=st.dictionaries(
        st.text(min_size=1, max_size=300).filter(lambda k: not k.isspace()),
        st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**31), 2**31),
        max_size=20,
    ),
)
def test_hand_encoded_scalar_events_match_protobuf_for_any_keys_and_values(step, numbers):
    from tensorboardX.proto import event_pb2, summary_pb2

    from writers import _tb_summary

    encoded = _tb_summary.scalar_event(step, numbers)
    wall_time = event_pb2.Event.FromString(encoded).wall_time
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in numbers.items()]
    expected = event_pb2.Event(
        step=step, wall_time=wall_time, summary=summary_pb2.Summary(value=values)
    )
    assert encoded == expected.SerializeToString()


def test_url_logdirs_get_one_new_object_per_flush(tmp_path):
    import fsspec

    fs = fsspec.filesystem("memory")
    w = writers.TensorBoardWriter("memory://tb-bucket/run", flush_secs=3600)
    assert w.path.startswith("memory://tb-bucket/run/events.out.tfevents.")
    w.write_scalars(3, {"loss": 0.5})
    w.flush()
    w.flush()  # nothing new: no new object
    w.write_scalars(4, {"loss": 0.25})
    w.close()
    names = sorted(fs.ls("/tb-bucket/run", detail=False))
    assert len(names) == 2 and w.path.endswith(names[0])
    for name in names:  # parts in name order are the event stream
        (tmp_path / os.path.basename(name)).write_bytes(fs.cat_file(name))
    loss = _accumulator(tmp_path).Scalars("loss")
    assert [(s.step, s.value) for s in loss] == [(3, 0.5), (4, 0.25)]
    fs.rm("/tb-bucket", recursive=True)
    with pytest.raises(ValueError, match=r"fsspec knows no nope:// protocol"):
        writers.TensorBoardWriter("nope://bucket/run")


def test_the_flush_timer_outlives_failed_uploads_and_logs_them_once(tmp_path, caplog):
    import fsspec

    w = writers.TensorBoardWriter("memory://tb-flaky/run", flush_secs=0.01)
    real_flush, calls = w._file.flush, []

    def flaky_flush():  # the first three uploads fail, as when the network drops
        calls.append(threading.current_thread().name)
        if len(calls) <= 3:
            raise OSError("connection reset")
        real_flush()

    w._file.flush = flaky_flush
    w.write_scalars(7, {"loss": 0.5})
    fs = fsspec.filesystem("memory")
    deadline = time.monotonic() + 30
    # Until the 4th call, the upload: a timed flush before the patch may have put the file's
    # header there already, and a close() then would raise the patched failure itself.
    while len(calls) < 4 or not (
        fs.exists("/tb-flaky/run") and fs.ls("/tb-flaky/run", detail=False)
    ):
        assert time.monotonic() < deadline, "the timer stopped after a failed upload"
        time.sleep(0.01)
    w.close()
    assert (
        calls[:4] == ["TensorBoardWriter-flush"] * 4
    )  # the timer's own thread, failing, then uploading
    logged = [r for r in caplog.records if "a timed flush failed" in r.getMessage()]
    assert len(logged) == 1 and "connection reset" in (logged[0].exc_text or "")
    for name in fs.ls("/tb-flaky/run", detail=False):
        (tmp_path / os.path.basename(name)).write_bytes(fs.cat_file(name))
    assert [(s.step, s.value) for s in _accumulator(tmp_path).Scalars("loss")] == [(7, 0.5)]
    fs.rm("/tb-flaky", recursive=True)


def test_a_writer_never_closed_still_writes_its_events_at_exit(tmp_path):
    import subprocess
    import sys

    script = (
        "import writers\n"
        f"w = writers.TensorBoardWriter({str(tmp_path)!r}, flush_secs=3600)\n"
        "w.write_scalars(7, {'loss': 0.25})\n"
        "# no close() and no flush(): the exit hook must write the buffered event\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert [(s.step, s.value) for s in _accumulator(tmp_path).Scalars("loss")] == [(7, 0.25)]


def test_summary_metadata_per_key_and_a_none_bucket_count_as_clus_writer_takes_them(tmp_path):
    from tensorboard.compat.proto import summary_pb2

    plugin = summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
    w = writers.TensorBoardWriter(tmp_path)
    raw = {"t": np.array(["a", "b"]), "raw": np.ones(2, np.float32)}
    w.write_summaries(1, raw, {"t": summary_pb2.SummaryMetadata(plugin_data=plugin)})
    w.write_histograms(2, {"h": np.arange(4.0)}, {"h": None})  # None: 30 buckets
    writers.write_values(w, 3, {"g": clu.values.Histogram(np.arange(3.0), None)})
    w.close()
    acc = _accumulator(tmp_path)
    assert acc.SummaryMetadata("t").plugin_data.plugin_name == "text"
    assert list(tensor_util.make_ndarray(acc.Tensors("raw")[0].tensor_proto)) == [1.0, 1.0]
    assert acc.Tensors("t")[0].tensor_proto.string_val == [b"a", b"b"]
    h, g = acc.Histograms("h")[0].histogram_value, acc.Histograms("g")[0].histogram_value
    assert (h.num, h.sum, h.max, g.num, g.sum, g.max) == (4, 6.0, 3.0, 3, 3.0, 2.0)


# TensorBoard's own reader overflows interpolating such a histogram (its `_lerp`); ours does not.
@pytest.mark.filterwarnings("ignore:overflow encountered in scalar multiply:RuntimeWarning")
def test_one_bucket_and_a_range_past_float64_are_kept_as_asked(tmp_path):
    """`num_buckets=1` became 2 buckets; values of +-1e308 gave inf bucket edges (and numpy
    overflow warnings, errors under -W error) in TensorBoard."""
    w = writers.create_default_writer(tmp_path, console=False)
    arrays = {"wide": np.array([0.0, 1e308, -1e308]), "one": np.array([1.0, 2.0, 3.0])}
    w.write_histograms(1, arrays, num_buckets={"one": 1, "wide": 4})
    w.close()
    histograms = _accumulator(tmp_path)
    one = histograms.Histograms("one")[0].histogram_value
    assert (list(one.bucket_limit), list(one.bucket)) == ([1.0, 3.0], [0.0, 3.0])
    wide = histograms.Histograms("wide")[0].histogram_value
    assert list(wide.bucket_limit) == [-1e308, -5e307, 0.0, 5e307, 1e308]
    assert list(wide.bucket) == [0.0, 1.0, 0.0, 1.0, 1.0]
    (line,) = writers.read_jsonl(tmp_path)
    assert (line["one"]["edges"], line["one"]["counts"]) == ([1.0, 3.0], [3])
    assert line["wide"]["edges"] == [-1e308, -5e307, 0.0, 5e307, 1e308]
    assert line["wide"]["counts"] == [1, 0, 1, 1]
