"""Checked values as PNG, WAV (standard library only), `.npy`, filmstrips, histograms, hparams."""

import io
import math
import struct
import wave
import zlib
from typing import Any

import numpy as np

from writers import _checks


def png(image: np.ndarray) -> bytes:
    """Encodes one `[H, W, C]` uint8 image (C in 1, 3, 4) as PNG bytes."""
    height, width, channels = image.shape
    # Each row starts with filter type 0 (none).
    rows = np.concatenate(
        [np.zeros((height, 1), np.uint8), np.ascontiguousarray(image).reshape(height, -1)], axis=1
    )
    color = {1: 0, 3: 2, 4: 6}[channels]  # grayscale, RGB, RGBA
    header = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    chunks = ((b"IHDR", header), (b"IDAT", zlib.compress(rows.tobytes(), 6)), (b"IEND", b""))
    return b"\x89PNG\r\n\x1a\n" + b"".join(
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        for kind, data in chunks
    )


def wav(clip: np.ndarray, sample_rate: int) -> bytes:
    """Encodes one `[T, C]` float clip in [-1, 1] as 16-bit PCM WAV bytes (clipped)."""
    pcm = np.clip(np.nan_to_num(clip.astype(np.float64)), -1.0, 1.0)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(clip.shape[1])
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(np.rint(pcm * 32767.0).astype("<i2").tobytes())
    return buffer.getvalue()


def npy(array: np.ndarray) -> bytes:
    """`array` in NumPy's `.npy` format (`np.load` reads it back exactly; bfloat16 as float32)."""
    array = _checks._widened(array)  # exact: NumPy's format has no bfloat16 or float8
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def filmstrip(video: np.ndarray) -> np.ndarray:
    """Turns a `[N, T, H, W, C]` video into N uint8 images `[H, T*W, C]` (frames side by side)."""
    n, t, h, w, c = video.shape
    return _checks.images_as_uint8(video.transpose(0, 2, 1, 3, 4).reshape(n, h, t * w, c))


def histogram(arr: np.ndarray, num_buckets: int | None) -> dict[str, Any]:
    """Count, min, max, mean, bucket edges and counts of a checked histogram input."""
    flat = arr.astype(np.float64).reshape(-1)
    counts, edges = _checks.bucketize(flat, num_buckets)
    return {
        "count": int(flat.size),
        "min": float(flat.min()),
        "max": float(flat.max()),
        "mean": mean(flat),
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
    }


def mean(flat: np.ndarray) -> float:
    """The mean of finite float64 values, also where their sum overflows (near float64's limit)."""
    with np.errstate(over="ignore"):
        total = float(flat.sum())
        if math.isfinite(total):
            return total / flat.size
        # Summed after the division, three float64 maxima made inf again: never past the ends.
        return float(np.clip((flat / flat.size).sum(), flat.min(), flat.max()))


def as_float(number: int | float) -> float:
    """`float(number)`, an int beyond float64's range as +-inf (what TensorBoard stores)."""
    try:
        return float(number)
    except OverflowError:
        return math.inf if number > 0 else -math.inf


def hparam(value: object) -> bool | int | float | str:
    """A hyperparameter as a bool, number or str (anything else becomes its `str()`).

    A float narrower than float64 (float32, float16, bfloat16) becomes the float of its
    shortest digits in its own dtype: a float32 0.1 is 0.1, not 0.10000000149011612, so a
    tracker's filter on the value the user set (MLflow's `params.lr = '0.1'`) finds it.
    """
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, str):  # numpy's str_ and enums too: W&B names a StrEnum by its name
        return _checks.plain_str(value)
    if isinstance(value, np.ndarray) or _checks._looks_like_array(value):  # jax, 0-d numpy
        arr = np.asarray(value)
        if arr.dtype == np.bool_ and arr.size == 1:
            return bool(arr.reshape(()))
        if _checks._not_a_scalar("hparam", arr) is None:  # one number
            number = _checks.to_number("hparam", arr)
            if _checks._is_float(arr.dtype) and arr.dtype.itemsize < 8:
                return shortest(float(number), arr.dtype)
            return number
    elif isinstance(value, int | float):
        return _checks.to_number("hparam", value)
    with np.printoptions(legacy="1.25"):  # a list of NumPy numbers as [64], not [np.int64(64)]
        return _checks.plain_str(str(value))  # complex, timedelta64 too: JSON has no number


def shortest(number: float, dtype: Any) -> float:
    """The float of the fewest significant digits that `dtype` rounds to `number` (a value of it).

    A float32 0.1 is 0.1 (what `repr` shows), not 0.10000000149011612; a bfloat16 0.1 is 0.1
    too (ml_dtypes' `repr` shows 6 digits, 0.100098). NaN and infinities stay as they are.
    """
    if not math.isfinite(number):
        return number
    target = np.asarray(number).astype(dtype)  # exact: `number` is a value of `dtype`
    with np.errstate(over="ignore", invalid="ignore"):  # a candidate past the dtype's range
        for digits in range(1, 18):
            candidate = float(f"{number:.{digits}g}")  # the closest decimal of that many digits
            if np.asarray(candidate).astype(dtype) == target:
                return candidate
    return number
