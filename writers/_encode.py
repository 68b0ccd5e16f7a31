"""PNG and WAV encoders for the TensorBoard writer, with only the standard library.

tensorboardX encodes images with Pillow and audio with soundfile, neither of which
this package depends on; both formats are simple enough to write directly.
"""

from __future__ import annotations

import io
import struct
import wave
import zlib

import numpy as np

_PNG_COLOR_TYPE = {1: 0, 3: 2, 4: 6}  # channels -> grayscale, RGB, RGBA


def png(image: np.ndarray) -> bytes:
    """Encodes one `[H, W, C]` uint8 image (C in 1, 3, 4) as PNG bytes."""
    height, width, channels = image.shape
    # Each row starts with filter type 0 (none).
    rows = np.concatenate(
        [np.zeros((height, 1), np.uint8), np.ascontiguousarray(image).reshape(height, -1)], axis=1
    )
    header = struct.pack(">IIBBBBB", width, height, 8, _PNG_COLOR_TYPE[channels], 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            _png_chunk(b"IHDR", header),
            _png_chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)),
            _png_chunk(b"IEND", b""),
        ]
    )


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def wav(clip: np.ndarray, sample_rate: int) -> bytes:
    """Encodes one `[T, C]` float clip in [-1, 1] as 16-bit PCM WAV bytes (clipped)."""
    frames, channels = clip.shape
    pcm = np.clip(np.nan_to_num(clip.astype(np.float64)), -1.0, 1.0)
    samples = np.rint(pcm * 32767.0).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(samples.tobytes())
    return buffer.getvalue()
