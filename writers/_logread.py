"""The reading half of `writers.plot`: scalar series from `metrics.jsonl` or event files."""

import glob
import json
import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from writers._checks import Problems

JSONL_NAME = "metrics.jsonl"
EVENTS_GLOB = "events.out.tfevents.*"
_NON_FINITE = ("NaN", "Infinity", "-Infinity")  # JsonlWriter's spellings; float() reads them

# {(collection, key): {step: value}}; collection is None when a log does not set one.
Scalars = dict[tuple[str | None, str], dict[int, float]]


def find_runs(paths: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """`(label, files)` of every run directory at or under `paths` (FileNotFoundError if none).

    In path order. Files: `metrics.jsonl` if any, else the event files. Labels: a run given itself
    is `<parent>/<name>`, one found below `P` `<name of P>/<relative path>`; on a clash, the paths.
    """
    problems = Problems(
        "writers.plot: expected run directories holding metrics.jsonl or event files "
        "(runs/demo/train) or directories containing them (runs/demo); pass a run's model_dir"
    )
    found: list[tuple[str, str, tuple[str, ...]]] = []
    for given in paths:
        root = os.path.abspath(given)
        if not os.path.isdir(root):
            problems.value_problem(f"{given!r} is not a directory")
            continue
        before = len(found)
        for directory, subdirs, _ in os.walk(root):
            subdirs.sort()
            jsonl = os.path.join(directory, JSONL_NAME)
            pattern = os.path.join(glob.escape(directory), EVENTS_GLOB)
            files = (jsonl,) if os.path.isfile(jsonl) else tuple(sorted(glob.glob(pattern)))
            if not files:
                continue
            parent = os.path.dirname(root) if directory == root else root
            label = os.path.join(os.path.basename(parent), os.path.relpath(directory, parent))
            found.append((label.replace(os.sep, "/"), directory, files))
        if len(found) == before:
            problems.value_problem(
                f"no {JSONL_NAME} and no {EVENTS_GLOB} files in {given!r} or any directory below it"
            )
    problems.raise_if_any(error=FileNotFoundError)
    labels = [label for label, _, _ in found]
    if len(set(labels)) < len(labels):
        labels = [os.path.relpath(directory) for _, directory, _ in found]
    return [(label, f) for label, (_, _, f) in zip(labels, found, strict=True)]


def read_run(files: Sequence[str]) -> Scalars:
    """The scalar series of one run; a step written twice keeps its last value (as TensorBoard)."""
    scalars: Scalars = {}
    for path in files:
        points = read_jsonl(path) if path.endswith(".jsonl") else read_events(path)
        for collection, step, key, value in points:
            scalars.setdefault((collection, key), {})[step] = value
    return scalars


def read_jsonl(path: str) -> Iterator[tuple[str | None, int, str, float]]:
    """`(collection, step, key, value)` for every number in a JSONL log, in file order."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return  # still being written: read it next time
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a blank line, or one torn by a crash
            step = record.get("step")
            if not isinstance(step, int):
                continue
            collection = record.get("collection")
            for key, value in record.items():  # bools, texts and summarized arrays are no scalars
                if key not in ("step", "time", "collection") and (
                    type(value) in (int, float) or value in _NON_FINITE
                ):
                    yield collection, step, key, float(value)


def read_events(path: str) -> Iterator[tuple[str | None, int, str, float]]:
    """`(None, step, tag, value)` for every scalar (`simple_value`, or TF2's scalars plugin)."""
    from tensorboardX.proto import event_pb2  # noqa: PLC0415  (only when event files are read)

    from writers._records import masked_crc32c  # noqa: PLC0415

    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    while offset + 12 <= len(data):
        # A record: [length u64][masked crc of length u32][payload][masked crc of payload u32]
        length, header_crc = struct.unpack_from("<QI", data, offset)
        end = offset + 12 + length + 4
        if end > len(data):
            return  # still being written
        payload = data[offset + 12 : end - 4]
        (payload_crc,) = struct.unpack_from("<I", data, end - 4)
        header = data[offset : offset + 8]
        if header_crc != masked_crc32c(header) or payload_crc != masked_crc32c(payload):
            raise ValueError(
                f"writers.plot: record at byte {offset} of {path!r} fails its CRC check (a "
                "corrupted event file); move the file out of the run directory to plot the others."
            )
        offset = end
        event = event_pb2.Event.FromString(payload)
        if not event.HasField("summary"):
            continue
        for value in event.summary.value:
            number = _scalar(value)
            if number is not None:
                yield None, int(event.step), value.tag, number


def _scalar(value: Any) -> float | None:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.metadata.plugin_data.plugin_name != "scalars":
        return None
    tensor = value.tensor
    for field in (tensor.float_val, tensor.double_val):
        if len(field) == 1:
            return float(field[0])
    fmt = {1: "<f", 2: "<d"}.get(tensor.dtype)  # DT_FLOAT, DT_DOUBLE
    if fmt and len(tensor.tensor_content) == struct.calcsize(fmt):
        return float(struct.unpack(fmt, tensor.tensor_content)[0])
    return None
