"""What `WandbWriter` and `MlflowWriter` share: the optional import, process 0, filmstrips."""

from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np

from writers import _checks


def import_extra(module: str, extra: str, writer: str) -> ModuleType:
    """Imports an optional tracker library, or raises an ImportError naming the extra.

    Raises:
      ImportError: `module` is not installed; the message says which extra installs it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{writer} needs the {module!r} package, which is not installed ({err}). Install "
            f"the extra: pip install 'jax-metrics-manager[{extra}]'."
        ) from err


def writes_here(process_index: int | None) -> bool:
    """True on the process that talks to the tracker: index 0 (JAX's, when None is given)."""
    if process_index is None:
        import jax  # imported here: `import writers` must not import JAX

        process_index = jax.process_index()
    return process_index == 0


def filmstrip(video: np.ndarray) -> np.ndarray:
    """Turns a `[N, T, H, W, C]` video into N uint8 images `[H, T*W, C]` (frames side by side)."""
    n, t, h, w, c = video.shape
    return _checks.images_as_uint8(video.transpose(0, 2, 1, 3, 4).reshape(n, h, t * w, c))


def hparam(value: object) -> bool | int | float | str:
    """A hyperparameter as a bool, number or str (anything else becomes its `str()`)."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float | np.number):
        return _checks.to_number("hparam", value)
    return str(value)
