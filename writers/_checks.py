"""Input checks shared by every writer (the contract in `writers.interface`), and `Problems`.

Each looks at every key of a call before raising, so one error lists every problem (`Problems`,
also `metrics_manager`'s error collector: `writers` never imports `metrics_manager`).
"""

import copy
import dataclasses
import decimal
import fractions
import inspect
import math
import numbers
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from writers.interface import MetricWriter

MAX_STEP = 2**63  # steps are int64 in TensorBoard's event proto; larger ones read back wrong
DEFAULT_NUM_BUCKETS = 30
MAX_BUCKETS = 2**20
MAX_CHANNELS = 2**15 - 1  # a WAV frame of 16-bit samples: its byte count is a 16-bit field


def describe(x: Any) -> str:
    """A short description of a value for error messages: type, and shape/dtype for arrays."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"{type(x).__name__} of shape {tuple(x.shape)} and dtype {x.dtype}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


class Problems:
    """A call's problems, raised as one `TypeError` (if any is about a type) or `ValueError`."""

    def __init__(self, context: str = "") -> None:
        self.context = context
        self.type_errors: list[str] = []
        self.value_errors: list[str] = []

    def add(self, kind: type[Exception], message: str) -> None:
        (self.type_errors if issubclass(kind, TypeError) else self.value_errors).append(message)

    def type_problem(self, message: str) -> None:
        self.type_errors.append(message)

    def value_problem(self, message: str) -> None:
        self.value_errors.append(message)

    def __bool__(self) -> bool:
        return bool(self.type_errors or self.value_errors)

    def message(self, context: str | None = None) -> str:
        """`"<call>: <problem>"`, or `"<call>: N problems:"` and one `  - ` line per problem."""
        problems = self.type_errors + self.value_errors
        if len(problems) == 1:
            return f"{context or self.context}: {problems[0]}"
        lines = "\n".join(f"  - {p}" for p in problems)
        return f"{context or self.context}: {len(problems)} problems:\n{lines}"

    def raise_if_any(
        self, context: str | None = None, error: type[Exception] | None = None
    ) -> None:
        """Raises one error naming every problem, of type `error` if given."""
        if self:
            raise (error or (TypeError if self.type_errors else ValueError))(self.message(context))


def check_step(step: Any, method: str = "write") -> int:
    """`step` (an integer, or an integer array of one element) as an int in [0, 2**63)."""
    if type(step) is int and 0 <= step < MAX_STEP:  # the common case: no ABC isinstance checks
        return step
    value = step
    if isinstance(value, np.ndarray) or _looks_like_array(value):
        arr = np.asarray(value)
        if arr.size == 1 and np.issubdtype(arr.dtype, np.integer):
            value = int(arr.reshape(()))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{method}: step must be a non-negative integer, got {step!r} of type "
            f"{type(step).__name__}. Pass an int, e.g. int(step)."
        )
    value = int(value)
    if not 0 <= value < MAX_STEP:
        raise ValueError(
            f"{method}: step must be a non-negative integer, got {value} (steps are int64 in "
            "TensorBoard and JSONL, so below 2**63). Check the step counter you pass in."
        )
    return value


def check_positive(value: Any, where: str, what: str, unit: str, fix: str) -> float:
    """A setting that must be a positive number (not a str from gin)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where}: {what} must be a number of {unit}, got {value!r} "
            f"({type(value).__name__})"
            + ("; in gin write a number, without quotes." if isinstance(value, str) else ".")
        )
    if not 0 < float(value) < math.inf:
        raise ValueError(f"{where}: {what} must be positive and finite, got {value!r}; {fix}.")
    return float(value)


def check_path(path: Any, where: str, what: str) -> str:
    """`os.fspath(path)` for a str or `os.PathLike`; anything else is a TypeError naming it,
    and a path that was a URL before its `//` was collapsed (by `pathlib`) a ValueError."""
    if not isinstance(path, str | os.PathLike) or isinstance(fspath := os.fspath(path), bytes):
        raise TypeError(
            f"{where}: {what} must be a directory, file or URL (a str or os.PathLike), got "
            f"{path!r} ({type(path).__name__})."
        )
    if problem := url_problem(path, what):
        raise ValueError(f"{where}: {problem}.")
    return fspath


# Schemes whose URLs name a bucket first: `gs://` alone, or `gs:///run`, names none (the
# first wrote ./gs:/metrics.jsonl, a local file, as `gs://` joined with a name is `gs:/...`).
_BUCKET_SCHEMES = ("gs", "gcs", "s3", "s3a")


def url_problem(path: Any, what: str) -> str | None:
    """The problem with a path that is a URL made wrong (`collapsed_url`), or an object
    store's URL naming no bucket (`gs://`, `gs:///run`), else None."""
    if problem := collapsed_url(path, what):
        return problem
    fspath = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    if not isinstance(fspath, str) or "://" not in fspath:
        return None
    scheme, rest = fspath.split("://", 1)
    if scheme not in _BUCKET_SCHEMES or (rest and not rest.startswith("/")):
        return None
    return (
        f"{what} {path!r} names no bucket: a {scheme}:// URL is {scheme}://<bucket>/<path>; "
        f"pass one such as {what}='{scheme}://my-bucket/{rest.strip('/') or 'run'}'"
    )


_COLLAPSED_URL = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]+):/(?!/)")


def collapsed_url(path: Any, what: str) -> str | None:
    """The problem with a path whose string is a URL with `//` made `/` (`Path("gs://b")` is
    `gs:/b`, as is `os.path.normpath("gs://b")`, a local directory: the run's files went there,
    not to the bucket), else None."""
    if not isinstance(path, str | os.PathLike):
        return None
    fspath = os.fspath(path)
    if not isinstance(fspath, str) or not (match := _COLLAPSED_URL.match(fspath)):
        return None
    import fsspec  # a declared dependency; only for a path that looks like one

    if match.group(1) not in fsspec.available_protocols():
        return None
    protocol, rest = match.group(1), fspath[match.end() :]
    # file:///tmp/run is /tmp/run; file://tmp/run, what `//` alone gives back, is ./tmp/run.
    url = f"{protocol}://{'/' * (protocol in ('file', 'local'))}{rest}"
    # A str needs its '//' back; a path object, a str (pathlib collapses '//' again).
    by, fix = ("", "with its '//'") if isinstance(path, str) else (" by pathlib", "as a str")
    return (
        f"{what} {path!r} is the URL {url!r} with its '//' collapsed to '/'{by}, so it "
        f"names the local path {fspath!r}; pass the URL {fix}, {what}={url!r}"
    )


def check_seconds(seconds: Any, where: str) -> float:
    """`flush_secs`: a positive number of seconds."""
    fix = "call flush() to write at once"
    return check_positive(seconds, where, "flush_secs", "seconds such as 10.0", fix)


def buffer_bytes(mb: Any, where: str) -> float:
    """`max_buffer_mb` in bytes; None (no bound) as infinity."""
    if mb is None:
        return math.inf
    fix = "None for no bound"
    return check_positive(mb, where, "max_buffer_mb", "MiB such as 256.0", fix) * 2**20


def _any(v: Any) -> bool:
    return True


# A writer constructor's setting: (its type is right, its value is right, what it takes).
_OPTIONS: dict[str, tuple[Callable[[Any], bool], Callable[[Any], bool], str]] = {
    "collection": (
        lambda v: v is None or isinstance(v, str),
        _any,
        "a str such as 'train', or None",
    ),
    "clock": (callable, _any, "a function returning seconds, such as time.time"),
    "stream": (
        lambda v: v is None or callable(getattr(v, "write", None)),
        _any,
        "a text stream such as sys.stderr (with write()), or None for sys.stdout",
    ),
    "color": (
        lambda v: v is None or isinstance(v, np.bool_ | numbers.Integral),
        lambda v: v is None or v in (0, 1),
        "True, False or None",
    ),
    "total_steps": (
        lambda v: v is None or (isinstance(v, numbers.Integral) and not isinstance(v, bool)),
        lambda v: v is None or v >= 1,
        "a positive int or None",
    ),
    "max_array_size": (
        lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
        lambda v: v >= 0,
        "a number of elements >= 0 (0: no tensor values in lines; math.inf: all)",
    ),
    "filename_suffix": (
        lambda v: isinstance(v, str),
        lambda v: "/" not in v and os.sep not in v,
        "a str without '/', such as '.train'",
    ),
}


def check_options(where: str, **options: Any) -> None:
    """A writer's constructor settings, refused at construction instead of at its first write."""
    problems = Problems(where)
    for name, value in options.items():
        type_ok, value_ok, takes = _OPTIONS[name]
        if not type_ok(value) or not value_ok(value):
            kind = ValueError if type_ok(value) else TypeError
            literal = name in ("color", "total_steps", "max_array_size") and isinstance(value, str)
            hint = "; in gin write it without quotes" if literal else ""
            problems.add(
                kind, f"{name} must be {takes}, got {value!r} ({type(value).__name__}){hint}."
            )
    problems.raise_if_any()


class Checked(dict):  # type: ignore[type-arg]
    """Values checked and converted at a public entry point; `BaseWriter` skips its checks."""

    __slots__ = ()


def takes_keyword(parameters: Mapping[str, inspect.Parameter] | None, name: str) -> bool:
    """Whether a callable of these `parameters` (None: no signature to read, a builtin) can be
    passed `name`: it names it, takes `**kwargs`, or cannot tell."""
    if parameters is None or name in parameters:
        return True
    return any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def parameters(factory: Callable[..., Any]) -> Mapping[str, inspect.Parameter] | None:
    """`factory`'s parameters (a class: its `__init__`'s, also under gin's wrapper, which
    reports `(*args, **kwargs)`); None without a signature to read (a builtin)."""
    target = inspect.unwrap(factory.__init__) if inspect.isclass(factory) else factory
    try:
        return inspect.signature(target).parameters
    except (TypeError, ValueError):
        return None


def copied(value: Any) -> Any:
    """A deep copy of a hyperparameter (a list the program appends to after the call), or
    the value itself where it has none (a lock, a module): the writers only show it."""
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001
        return value


def own_dicts(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments for one of several writers: its own copy of each dict (a `Checked`
    stays one), so a writer that pops or changes a key changes nothing the others get."""
    return {k: type(v)(v) if type(v) in (dict, Checked) else v for k, v in kwargs.items()}


def check_keys(values: Any, method: str, found: Problems | None = None) -> None:
    """Raises unless `values` is a mapping whose keys are all non-empty strings; with
    `found`, adds the problems there instead."""
    if type(values) is not dict and not isinstance(values, Mapping):
        message = (
            f"expected a mapping from name to value, got {type(values).__name__}. Wrap the "
            "value, e.g. {'loss': value}."
        )
        if found is None:
            raise TypeError(f"{method}: {message}")
        found.type_problem(message)
        return
    if all(type(k) is str and k and not k.isspace() and (k.isascii() or _utf8(k)) for k in values):
        return  # the common case, in one pass
    problems = Problems(method) if found is None else found
    if surrogates := surrogate_problem(values):
        problems.value_problem(surrogates)
    if bad_types := [k for k in values if not isinstance(k, str)]:
        listed = ", ".join(f"{k!r} ({type(k).__name__})" for k in bad_types)
        problems.type_problem(f"every key must be a str, got {listed}. Convert keys with str().")
    if empty := [k for k in values if isinstance(k, str) and not k.strip()]:
        problems.value_problem(
            f"keys must be non-empty names, got {empty!r}. Give each value a name such "
            "as 'loss' or 'eval/accuracy'."
        )
    if found is None:
        problems.raise_if_any()


def _utf8(key: str) -> bool:
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def surrogate_problem(keys: Iterable[Any]) -> str | None:
    """The message for str keys UTF-8 cannot encode (lone surrogates), else None."""
    bad = [k for k in keys if isinstance(k, str) and not k.isascii() and not _utf8(k)]
    if not bad:
        return None
    return (
        f"keys {bad!r} hold lone surrogates (as os.fsdecode gives for bytes that are not "
        "UTF-8), which no writer can store; decode the name with errors='replace', e.g. "
        "key.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')."
    )


def reserved_problem(keys: Iterable[str], reserved: Mapping[str, str]) -> str | None:
    """The message for keys a writer keeps for itself (`reserved`: key -> its name), else None."""
    if not reserved or reserved.keys().isdisjoint(keys):
        return None
    taken = {key: reserved[key] for key in keys if key in reserved}
    return (
        f"keys {list(taken)} are reserved by writer(s) {sorted(set(taken.values()))}, which "
        "store their own fields under them (JSONL: step, time and collection in every line; "
        f"W&B: _step, _runtime, _timestamp); nothing was written; rename them, e.g. "
        f"'train/{next(iter(taken))}'."
    )


def check_metadata(metadata: Any, method: str) -> None:
    """Raises unless metadata is None, a proto, its bytes, or a mapping of key to one (CLU's)."""
    for m in metadata.values() if isinstance(metadata, Mapping) else [metadata]:
        if not (m is None or isinstance(m, bytes) or hasattr(m, "SerializeToString")):
            raise TypeError(
                f"{method}: metadata must be a SummaryMetadata proto, its serialized bytes, None, "
                f"or a mapping of key to one of these; got {describe(m)}."
            )


def as_mapping(hparams: Any) -> Any:
    """A config that is no `Mapping` (ml_collections' ConfigDict, a dataclass) as a dict."""
    fields = _config_items(hparams)
    return hparams if isinstance(hparams, Mapping) or fields is None else dict(fields)


def _config_items(value: Any) -> Any:
    """The entries of a config (anything with `.items()`, a dataclass instance), else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return value.items() if callable(getattr(value, "items", None)) else None


def flat_hparams(hparams: Mapping[str, Any], problems: Problems) -> dict[str, Any]:
    """Nested configs as dotted names, as CLU names them: `{"opt": {"lr": 0.1}}` ->
    `{"opt.lr": 0.1}` (a list stays one value, an empty config is "{}"); a name given twice
    goes to `problems`."""
    flat: dict[str, Any] = {}
    inside: set[int] = set()  # the configs `add` is in: one holding itself raised RecursionError

    def add(name: str, value: Any) -> None:
        if (items := _config_items(value)) is not None:
            if id(value) in inside:
                problems.value_problem(
                    f"hyperparameter {name!r} is a config that holds itself (a cycle), which "
                    "has no end to flatten into names; pass a copy without the loop"
                )
                return
            inside.add(id(value))
            items = list(items)
            for key, item in items:
                if isinstance(key, str) and key.strip():
                    add(f"{name}.{key}", item)
                else:  # {"x": {"": 1}} was "x.", {"x": {1: 1}} "x.1"
                    problems.add(
                        ValueError if isinstance(key, str) else TypeError,
                        f"hyperparameter {name!r} holds the key {key!r}; nested keys must be "
                        "non-empty str names, as top-level ones",
                    )
            if not items:
                add(name, "{}")
            inside.discard(id(value))
        elif name in flat:
            problems.value_problem(
                f"hyperparameter {name!r} is given twice, once as a nested name (dots join "
                "nested names); rename one of them"
            )
        else:
            if _holds_long_int(value):  # written as str(value): a list's failed too
                problems.value_problem(
                    f"hyperparameter {name!r} {'is' if isinstance(value, int) else 'holds'} an "
                    f"int of more than {sys.get_int_max_str_digits()} digits, which Python "
                    "refuses to turn into text, as the writers do; pass float(value) (inf past "
                    "1.8e308), or raise sys.set_int_max_str_digits()"
                )
            elif problem := _text_problem(value):
                problems.add(
                    type(problem),
                    f"hyperparameter {name!r} ({type(value).__name__}) cannot be turned into "
                    f"text, as the writers write it: {problem}; pass str(value) where it works, "
                    "or a number, str or list in its place",
                )
            flat[name] = value

    for key, value in hparams.items():
        add(key, value)
    return flat


def check_call(method: str, step: Any, values: Any) -> int:
    """`check_step` and `check_keys` together: one error lists the problems of both."""
    problems = Problems(method)
    checked = 0
    try:
        checked = check_step(step, method)
    except (TypeError, ValueError) as err:
        problems.add(type(err), str(err).removeprefix(f"{method}: "))
    check_keys(values, method, problems)
    problems.raise_if_any()
    return checked


# CLU's writer methods, in the order `MetricWriter` declares them.
WRITER_METHODS = tuple(m for m in vars(MetricWriter) if m in MetricWriter.__abstractmethods__)
# Each writer method's parameters, as every caller passes them: by keyword.
_KEYWORDS = {
    m: tuple(inspect.signature(getattr(MetricWriter, m)).parameters)[1:] for m in WRITER_METHODS
}


def check_writers(
    writers: Mapping[str, Any],
    context: str,
    required: tuple[str, ...] = WRITER_METHODS,
    fix: str = "pass instances with CLU's MetricWriter methods, e.g. writers.JsonlWriter(path)",
) -> None:
    """Raises a TypeError naming every object that lacks the `required` methods, whose
    methods cannot take CLU's parameter names by keyword, as every caller passes them, or
    are `async def` (each call would make a coroutine nobody awaits, writing nothing)."""
    problems = Problems(context)
    for name, writer in writers.items():
        if isinstance(writer, type):
            problems.type_problem(
                f"{name!r} is the class {writer.__name__}, not an instance; {fix}"
            )
            continue
        if missing := [m for m in required if not callable(getattr(writer, m, None))]:
            problems.type_problem(
                f"{name!r} ({type(writer).__name__}) lacks {', '.join(missing)}; {fix}"
            )
        for method, keywords in _KEYWORDS.items():
            if inspect.iscoroutinefunction(getattr(writer, method, None)):
                problems.type_problem(
                    f"{name!r} ({type(writer).__name__}).{method} is async def: its calls would "
                    "return coroutines nobody awaits and write nothing; make it a plain def "
                    "that runs the coroutine (asyncio.run, or a loop of the writer's own)"
                )
            try:
                signature = inspect.signature(getattr(writer, method))
            except (AttributeError, TypeError, ValueError):  # absent, or no signature to read
                continue
            try:
                signature.bind(**dict.fromkeys(keywords))
            except TypeError as err:
                has = f"{method}({', '.join(signature.parameters)})"
                called = f"{method}({', '.join(f'{k}=...' for k in keywords)})"
                problems.type_problem(
                    f"{name!r} ({type(writer).__name__}).{has} cannot take {called}: {err}; "
                    "accept MetricWriter's parameters by those names (callers pass them by "
                    "keyword) and give any other a default"
                )
    problems.raise_if_any()


def donated_problem(what: str, count: int = 1) -> str:
    """One wording for `count` device arrays, named by `what`, deleted before they were read."""
    one = count == 1
    return (
        f"{what}: {'a device array' if one else 'device arrays'} deleted (donated to a later "
        f"computation) before {'it was' if one else 'they were'} read. Pass a copy, or do not "
        f"donate {'it' if one else 'them'}."
    )


def named_if_donated(method: str, kwargs: Mapping[str, Any], err: BaseException) -> BaseException:
    """`err`, or where device arrays of the call were deleted before the writer read them, a
    ValueError naming their keys and the fix, as the manager names them."""
    keys = [
        repr(key)
        for value in kwargs.values()
        if isinstance(value, Mapping)
        for key, array in value.items()
        if getattr(array, "is_deleted", bool)()
    ]
    # A writer's own error (an OSError, a tracker's RuntimeError raised after it read the
    # arrays, which the loop then donated) is left as it was: only JAX's names a deleted one
    # ("Array has been deleted with shape=...", XLA's "... deleted or donated buffer").
    deleted = any(words in str(err) for words in ("has been deleted", "deleted or donated"))
    if not keys or not isinstance(err, RuntimeError) or not deleted:
        return err
    kind = method.removeprefix("write_")  # "summaries" read "summarie 'x'"
    if len(keys) == 1:
        kind = kind[:-3] + "y" if kind.endswith("ies") else kind.removesuffix("s")
    named = ValueError(donated_problem(f"{kind} {', '.join(keys)}", len(keys)))
    named.__cause__ = err
    return named


def to_number(key: str, value: Any) -> int | float:
    """A number or one-element array as a Python int or float (NaN, inf kept; bfloat16 widens)."""
    if isinstance(value, np.generic | np.ndarray) or _looks_like_array(value):
        if getattr(value, "is_deleted", bool)():
            raise ValueError(donated_problem(f"scalar {key!r}"))
        # By shape first: reading a vector sharded over processes raised JAX's "Fetching
        # value ... non-addressable devices" where one still computing got this message.
        if math.prod(value.shape) != 1 and (err := _not_a_scalar(key, value)):
            raise err
        try:
            arr = _widened(np.asarray(value))
        except (TypeError, ValueError) as unread:  # a JAX PRNG key: JAX's words named no key
            raise TypeError(
                f"scalar {key!r} must be a number, got {describe(value)}, which NumPy cannot "
                f"read ({unread})"
            ) from unread
        if err := _not_a_scalar(key, arr):
            raise err
        return float(arr.reshape(())) if _is_float(arr.dtype) else int(arr.reshape(()))
    if isinstance(value, numbers.Integral):  # bool, IntEnum, ...
        value = int(value)
        if _as_text(value):
            return value
        raise ValueError(
            f"scalar {key!r} is an int of more than {sys.get_int_max_str_digits()} digits, which "
            "Python refuses to write as text (JSONL, the console and the log write it so). "
            "Pass float(value) (inf past 1.8e308, as TensorBoard stores it), or raise "
            "sys.set_int_max_str_digits()."
        )
    if isinstance(value, numbers.Real | decimal.Decimal):  # a Decimal is no numbers.Real
        try:
            return float(value)
        except OverflowError:  # a Fraction past float64's range: +-inf, as TensorBoard keeps it
            return -math.inf if value < 0 else math.inf
        except Exception as err:  # a Real of the program's own whose __float__ raises
            if isinstance(value, decimal.Decimal) and value.is_snan():  # float() refuses it
                return math.nan  # NaN, as Decimal('NaN')
            raise ValueError(
                f"scalar {key!r} must be a number, got {describe(value)}, whose float() raised "
                f"{type(err).__name__}: {err}. Pass a float or int."
            ) from err
    raise TypeError(
        f"scalar {key!r} must be a number, got {value!r} of type {type(value).__name__}. "
        + _scalar_fix(isinstance(value, numbers.Complex))
    )


def _scalar_fix(is_complex: bool) -> str:
    """The fix for a scalar that is no real number: a complex one was told to write strings
    with write_texts."""
    return (
        "Pass a real number: abs(x) or x.real." if is_complex else "Write strings with write_texts."
    )


def _not_a_scalar(key: str, arr: Any) -> Exception | None:
    """Why array `arr` cannot be scalar `key`, from its shape and dtype alone (no copy)."""
    if math.prod(arr.shape) != 1:
        return ValueError(
            f"scalar {key!r} must hold exactly one number, got an array of shape "
            f"{tuple(arr.shape)}. Reduce it first (e.g. .mean()) or write it as a histogram."
        )
    # Not timedelta64 ("m"); a dtype NumPy cannot interpret (torch's) is judged once read.
    if (dtype := numpy_dtype(arr.dtype)) is None or dtype.kind in "iubf" or _ml_wider(dtype):
        return None
    return TypeError(
        f"scalar {key!r} must be a number, got an array of dtype {arr.dtype}. "
        + _scalar_fix(np.dtype(arr.dtype).kind == "c")
    )


def scalar_problem(key: str, value: Any) -> Exception | None:
    """Why `value` cannot be scalar `key`; an array not on the host by shape and dtype alone."""
    if type(value) in _CONVERTERS and type(value) is not int:  # the common case, no conversion
        return None
    if _looks_like_array(value) and not isinstance(value, np.ndarray | np.generic):
        return _not_a_scalar(key, value)  # a device array: reading it could wait
    try:
        to_number(key, value)
    except (TypeError, ValueError) as err:
        return err
    return None


def _unready(value: Any) -> bool:
    """Whether `value` is a device array still being computed (a jax array not `is_ready()`)."""
    if getattr(value, "is_deleted", bool)():
        return False  # `to_number` says what to do
    return not getattr(value, "is_ready", lambda: True)()


def _is_float(dtype: Any) -> bool:
    return np.issubdtype(dtype, np.floating) or _is_ml_float(dtype)


def _as_text(value: int) -> bool:
    """Whether `str(value)` works: past `sys.get_int_max_str_digits()` digits it raises."""
    if value.bit_length() < 2000:  # 602 digits: below any limit (640), no str() made
        return True
    try:
        str(value)
    except ValueError:
        return False
    return True


def _holds_long_int(value: Any, depth: int = 0) -> bool:
    """Whether `value`, or an item of a list, tuple, set, dict or NumPy object array in it, or
    a `Fraction`'s numerator or denominator, is an int `str()` refuses (nested 8 deep at most:
    a list that holds itself is written as '[[...]]')."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        value = list(value.flat)
    elif isinstance(value, fractions.Fraction):  # written as 'numerator/denominator'
        value = (value.numerator, value.denominator)
    elif isinstance(value, dict):
        value = (*value, *value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return depth < 8 and any(_holds_long_int(item, depth + 1) for item in value)
    return isinstance(value, int) and not _as_text(value)


def _text_problem(value: Any) -> Exception | None:
    """Why `str(value)` or `repr(value)`, which the writers take, raises, else None."""
    if type(value) in (str, float, bool, int) or value is None:  # the common case
        return None
    for text in (str, repr):
        try:
            text(value)
        except Exception as err:  # noqa: BLE001  (the caller's own __str__)
            kind = TypeError if isinstance(err, TypeError) else ValueError
            return kind(f"{text.__name__}() raised {type(err).__name__}: {err}")
    return None


def _int(value: int) -> int:
    """A Python int as it is, if it can be written as text: `collect_numbers` names others."""
    if _as_text(value):
        return value
    raise ValueError(value)


# `to_number` by exact type, skipping isinstance checks against numpy's ABCs.
_CONVERTERS: dict[type, Callable[[Any], int | float]] = {
    **{t: float for t in (float, np.float16, np.float32, np.float64, np.longdouble)},
    int: _int,
    **{t: int for t in (bool, np.bool_, np.int8, np.int16, np.int32, np.int64)},
    **{t: int for t in (np.uint8, np.uint16, np.uint32, np.uint64)},
}


def _one_element(arr: np.ndarray) -> int | float:
    """A one-element array's number, as `to_number` reads it; KeyError for any other array
    (the checked path says why)."""
    if arr.size != 1:
        raise KeyError(arr.shape)
    return _CONVERTERS[arr.dtype.type](arr.reshape(())[()])


# A summary's values hold 0-d arrays (a `Sum`'s compute()): with one among 20 numbers, each
# went through `to_number` (~11 us a summary against ~3 us).
_FAST_CONVERTERS = {**_CONVERTERS, np.ndarray: _one_element}


def check_numbers(scalars: Mapping[str, Any], method: str) -> dict[str, int | float]:
    """`to_number` on every value (a new dict, same order); one error lists every bad key."""
    if type(scalars) is Checked:  # converted once already, at the public entry point
        return scalars
    problems = Problems(method)
    out = collect_numbers(scalars, problems)
    problems.raise_if_any()
    return out


def collect_numbers(
    scalars: Mapping[str, Any], problems: Problems, unready: list[str] | None = None
) -> dict[str, Any]:
    """`to_number` on every value; a bad one is added to `problems` and left out.

    With `unready`, a device array still being computed is checked by shape and dtype alone
    and kept as it is (reading it would wait for the device), its key added to `unready`.
    """
    converters = _FAST_CONVERTERS
    try:  # the common case: every value's type has a converter (one C-level pass)
        return {key: converters[type(value)](value) for key, value in scalars.items()}
    except (KeyError, ValueError):  # ValueError: an int too long for str() (`_int`)
        pass
    out: dict[str, int | float] = {}
    for key, value in scalars.items():
        convert = _CONVERTERS.get(type(value))
        try:
            if convert is not None and convert is not _int:
                out[key] = convert(value)
            elif unready is not None and _unready(value):
                if err := _not_a_scalar(key, value):
                    raise err
                out[key] = value
                unready.append(key)
            else:
                out[key] = to_number(key, value)
        except (TypeError, ValueError) as err:
            problems.add(type(err), str(err))
    return out


def check_arrays(
    arrays: Mapping[str, Any], method: str, kind: str, found: Problems | None = None
) -> dict[str, np.ndarray]:
    """Every value as a numpy array (ml_dtypes widened); one ValueError lists every bad one
    (with `found`, they are added there instead)."""
    problems = Problems(method) if found is None else found
    out = {}
    for key, value in arrays.items():
        if (arr := as_array(kind, key, value, problems)) is None:
            continue
        out[key] = arr = _widened(arr)
        if msg := array_problem(kind, key, arr):
            problems.value_problem(msg)
    if found is None:
        problems.raise_if_any()
    return out


def check_buckets(num_buckets: Any, problems: Problems, arrays: Any = None) -> dict[str, int]:
    """`num_buckets` as a dict of ints >= 1 (None for a key: the default), else a problem;
    also one for a key that names none of `arrays` (a typo's array got the default)."""
    if num_buckets is None:
        return {}
    if isinstance(num_buckets, Mapping) and isinstance(arrays, Mapping):
        if unknown := sorted(map(str, num_buckets.keys() - arrays.keys())):
            problems.value_problem(
                f"num_buckets names {unknown}, which no array of the call has (arrays "
                f"{sorted(map(str, arrays))}); those arrays would get the default "
                f"{DEFAULT_NUM_BUCKETS} buckets: match the arrays' keys"
            )
    counts = None
    if isinstance(num_buckets, Mapping):  # a key's None: the default, as CLU's writers read it
        counts = {k: n for k, n in num_buckets.items() if n is not None}
    ints = counts is not None and all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in counts.values()
    )
    if counts is None or not (ints and all(n >= 1 for n in counts.values())):
        problems.add(
            ValueError if ints else TypeError,
            f"num_buckets must map keys to bucket counts (ints >= 1) such as {{'w': 64}}, "
            f"or be None for {DEFAULT_NUM_BUCKETS} each; got {num_buckets!r}",
        )
        return {}
    if huge := sorted(str(k) for k, n in counts.items() if n > MAX_BUCKETS):
        problems.value_problem(
            f"num_buckets for {huge} must be at most {MAX_BUCKETS:,}, got "
            f"{max(counts.values()):,}: every writer builds and stores each bucket (a count "
            "such as 10**12 ran out of memory); TensorBoard's default is 30"
        )
    return {k: int(n) for k, n in counts.items()}


def array_problem(kind: str, key: str, arr: np.ndarray, values: bool = True) -> str | None:
    """What is wrong with one array of `kind`, or None; `values=False`: shape and dtype only."""
    complex_ = np.issubdtype(arr.dtype, np.complexfloating)  # its imaginary part would be lost
    # bools too: 0 and 1, as np.histogram bins them
    real = arr.dtype == np.bool_ or _ml_wider(arr.dtype) is not None
    real = real or (not complex_ and np.issubdtype(arr.dtype, np.number))
    if kind == "image" and (arr.ndim not in (3, 4) or arr.shape[-1] not in (1, 3, 4)):
        if arr.ndim in (3, 4) and arr.shape[-3] in (1, 3, 4) and arr.shape[-1] > 4:
            fix = " Move the channel axis last (np.moveaxis(x, -3, -1))."  # [C, H, W]: PyTorch's
        elif arr.ndim == 2:
            fix = " Add a channel axis for grayscale (x[..., None])."
        elif arr.ndim in (3, 4) and arr.shape[-1] == 2:
            fix = " Drop the alpha channel of a gray + alpha image (x[..., :1])."
        elif arr.ndim == 5:
            fix = " Write a video of shape [N, T, H, W, C] with write_videos."
        else:
            fix = ""
        return (
            f"image {key!r} must have shape [H, W, C] or [N, H, W, C] with C in (1, 3, 4), "
            f"got shape {arr.shape}.{fix}"
        )
    fix = " Pass np.abs(x) or x.real." if complex_ else ""
    if kind in ("image", "video") and not real:
        return f"{kind} {key!r} must be real numbers, got dtype {arr.dtype}.{fix}"
    if kind == "video" and (arr.ndim not in (4, 5) or arr.shape[-1] not in (1, 3, 4)):
        return (
            f"video {key!r} must have shape [T, H, W, C] or [N, T, H, W, C] with C in "
            f"(1, 3, 4), got shape {arr.shape}."
        )
    if kind == "audio" and (arr.ndim != 3 or not _is_float(arr.dtype)):
        if not _is_float(arr.dtype):
            fix = " Scale PCM samples first: x / 32768 for int16."
        elif arr.ndim == 2:
            fix = " Add a batch axis for one clip of shape [T, C] (x[None])."
        elif arr.ndim == 1:
            fix = " Add batch and channel axes for one mono clip (x[None, :, None])."
        else:
            fix = ""
        return (
            f"audio {key!r} must be a float array of shape [N, T, C] with values in "
            f"[-1, 1], got dtype {arr.dtype} and shape {arr.shape}.{fix}"
        )
    if kind == "audio" and (
        (channels := arr.shape[-1]) > MAX_CHANNELS or 0 < (samples := arr.shape[-2]) < channels
    ):  # more channels than samples: a clip of shape [N, C, T] (16,000 channels of 1 sample)
        why = (
            f"a WAV holds at most {MAX_CHANNELS}"
            if channels > MAX_CHANNELS
            else f"more than its {samples} sample{'s' * (samples != 1)} per channel"
        )
        return (
            f"audio {key!r} has {channels} channels (shape {arr.shape}, [N, T, C]); {why}. "
            "Move the channel axis last for clips of shape [N, C, T] (torchaudio's): "
            "np.moveaxis(x, -1, -2)."
        )
    if kind != "histogram":
        if arr.size == 0:
            return f"{kind} {key!r} is empty (shape {arr.shape}); there is nothing to draw or play."
        # Refused as in a histogram: the encoders wrote NaN as 0 (a black pixel, silence).
        if values and (bad := _nonfinite(arr)):
            what = "samples" if kind == "audio" else "pixels"
            return (
                f"{kind} {key!r} has {bad} NaN/Inf values out of {arr.size}; {what} need "
                "finite values. Replace them (np.nan_to_num(x)) or log the count as a scalar."
            )
        return None
    if not real:
        return f"histogram {key!r} must be real numbers, got dtype {arr.dtype}.{fix}"
    if arr.size == 0:
        return f"histogram {key!r} is empty (shape {arr.shape}); there is nothing to bin."
    if values and (bad := _nonfinite(arr)):
        return (
            f"histogram {key!r} has {bad} NaN/Inf entries out of {arr.size}; bins need "
            "finite values. Filter them (x[np.isfinite(x)]) or log the count as a scalar."
        )
    return None


def _nonfinite(arr: np.ndarray) -> int:
    """How many of a real array's values are NaN or infinite (none in an integer array)."""
    if arr.dtype == np.bool_ or np.issubdtype(arr.dtype, np.integer):
        return 0
    with np.errstate(over="ignore"):  # read as float64: a long double past 1.8e308 is inf
        finite = np.isfinite(arr.astype(np.float64) if arr.dtype.itemsize > 8 else arr)
    return int(np.size(arr) - np.count_nonzero(finite))


def check_sample_rate(sample_rate: Any, method: str) -> None:
    """Raises unless `sample_rate` is a positive int below 2**32."""
    if err := sample_rate_problem(sample_rate):
        raise type(err)(f"{method}: {err}")


def sample_rate_problem(sample_rate: Any) -> TypeError | ValueError | None:
    """What is wrong with `sample_rate` (not a positive int below 2**32), or None."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Integral):
        return TypeError(
            f"sample_rate must be an integer number of samples per second, got "
            f"{sample_rate!r} of type {type(sample_rate).__name__}."
        )
    if not 0 < int(sample_rate) < 2**32:  # a WAV header holds 32 bits
        return ValueError(
            "sample_rate must be a positive number of samples per second below 2**32 (a WAV "
            f"header's 32 bits), got {sample_rate}."
        )
    return None


def audio_tags(clips: Mapping[str, Any]) -> list[str]:
    """The tags of a call's clips: `key`, or `key/0` to `key/N-1` for a batch of N > 1."""
    return [k if len(c) == 1 else f"{k}/{i}" for k, c in clips.items() for i in range(len(c))]


def byte_rate_problem(sample_rate: int, clips: Mapping[str, Any]) -> str | None:
    """The message for clips whose WAV byte rate, sample_rate x 2 bytes x channels, passes the
    header's 32 bits (wave's struct.error), else None."""
    channels = {k: math.prod(np.shape(clip)[-1:]) for k, clip in clips.items()}  # no device read
    if fast := [k for k, c in channels.items() if int(sample_rate) * 2 * c >= 2**32]:
        return (
            f"sample_rate {sample_rate} is too high for the WAV header of {fast}: its byte "
            "rate, sample_rate x 2 bytes x channels, must be below 2**32"
        )
    return None


def check_shapes(kind: str, arrays: Mapping[str, Any], problems: Problems) -> dict[str, Any]:
    """`arrays` (lists, numbers and tensors of a dtype NumPy cannot interpret as numpy arrays),
    each checked by shape and dtype alone (`array_problem(values=False)`): a device array is
    not read, so not waited for."""
    out = {}
    for key, value in arrays.items():
        # A list, a number, or a tensor whose dtype NumPy cannot interpret (torch's: its
        # checks raised "Cannot interpret 'torch.float32' as a data type") is read now.
        if not (hasattr(value, "shape") and hasattr(value, "dtype")) or (
            numpy_dtype(value.dtype) is None
        ):
            if (value := as_array(kind, key, value, problems)) is None:
                continue
        out[key] = value
        if message := array_problem(kind, key, value, values=False) or sharded_problem(
            kind, key, value
        ):
            problems.value_problem(message)
    return out


def sharded_problem(kind: str, key: str, value: Any) -> str | None:
    """The message for a global array sharded over processes (process 0 cannot read it)."""
    if getattr(value, "is_fully_addressable", True) or value.is_fully_replicated:
        return None
    return (
        f"{kind} {key!r} of shape {tuple(value.shape)} is sharded over processes, and "
        "process 0, which writes, holds only its own shards; gather it on every "
        "process first: multihost_utils.process_allgather(x, tiled=True)"
    )


def check_texts(texts: Mapping[str, Any], method: str) -> dict[str, str]:
    """`collect_texts`, raising a TypeError that lists every key whose value is not a str."""
    problems = Problems(method)
    out = collect_texts(texts, problems)
    problems.raise_if_any()
    return out


def collect_texts(texts: Mapping[str, Any], problems: Problems) -> dict[str, str]:
    """Each str value as a plain str (numpy's `str_` too); any other value is a problem."""
    out = {}
    for key, value in texts.items():
        if isinstance(value, str):
            out[key] = plain_str(value)
        else:
            fix = (
                ".decode() bytes first"
                if isinstance(value, bytes | bytearray)
                else "convert with str(), or write numbers with write_scalars"
            )
            problems.type_problem(f"text {key!r} must be a str, got {describe(value)}; {fix}")
    return out


def plain_str(text: str) -> str:
    """`text` as a plain str (a `StrEnum` member as its value), lone surrogates as backslash
    escapes: TensorBoard's protobuf and MLflow's store refuse them."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode(errors="backslashreplace").decode()
    return str.__str__(text)


def outside_range(arr: np.ndarray, low: int) -> tuple[float, float, int, int] | None:
    """`(min, max, low, high)` of an image's or clip's finite values if they leave the range
    they are read in, `[low, 1]` for floats (beyond rounding), `[0, 255]` for integers."""
    if np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.uint8 and arr.size:
        least, most = int(arr.min()), int(arr.max())
        return (least, most, 0, 255) if least < 0 or most > 255 else None
    if not np.issubdtype(arr.dtype, np.floating):
        return None
    finite = arr[np.isfinite(arr)]
    if finite.size == 0:
        return None
    lo, hi = float(finite.min()), float(finite.max())
    return (lo, hi, low, 1) if lo < low - 1e-3 or hi > 1.001 else None


def images_as_uint8(arr: np.ndarray) -> np.ndarray:
    """Images as `[N, H, W, C]` uint8: ints read as [0, 255], floats as [0, 1], clipped, NaN 0.

    Floats as CLU's `tf.summary.image` converts them (`tf.image.convert_image_dtype` with
    `saturate=True`): `x * 255.5` in their own dtype, clipped to [0, 255], truncated. Rounded
    `x * 255` instead, 0.5 was 128 where CLU and TensorBoard show 127 (0.25: 64, not 63);
    `k / 255` still reads back as `k`."""
    if arr.ndim == 3:
        arr = arr[None]
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if np.issubdtype(arr.dtype, np.integer):
        return np.clip(arr, 0, 255).astype(np.uint8)
    with np.errstate(over="ignore"):  # past the dtype's range: inf, clipped to 255
        scaled = arr * arr.dtype.type(255.5)
    return np.clip(np.nan_to_num(scaled, nan=0.0), 0, 255).astype(np.uint8)


_ML_FLOATS = ("bfloat16", "float8_", "float6_", "float4_")  # dtype name prefixes
_ML_INTS = {"int2": np.int8, "int4": np.int8, "uint2": np.uint8, "uint4": np.uint8}


def _ml_wider(dtype: Any) -> Any:
    """The NumPy type that holds an ml_dtypes type's values exactly (JAX's bfloat16, float8,
    int4, ...: NumPy does not know them as numbers), or None for any other dtype."""
    if (known := numpy_dtype(dtype)) is None:
        return None
    name = known.name
    return np.float32 if name.startswith(_ML_FLOATS) else _ML_INTS.get(name)


def _widened(arr: np.ndarray) -> np.ndarray:
    wider = _ml_wider(arr.dtype)
    return arr if wider is None else arr.astype(wider)


def _is_ml_float(dtype: Any) -> bool:
    return _ml_wider(dtype) is np.float32


def _looks_like_array(value: Any) -> bool:
    # JAX, torch and other array types without importing them.
    return hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype")


def numpy_dtype(dtype: Any) -> np.dtype | None:
    """`dtype` as NumPy's, or None where NumPy cannot interpret it (a torch tensor's, a JAX
    PRNG key's): such an array is judged by what `np.asarray` makes of it."""
    try:
        return np.dtype(dtype)
    except TypeError:
        return None


def as_array(kind: str, key: str, value: Any, problems: Problems) -> np.ndarray | None:
    """`np.asarray(value)`, or None after adding to `problems` why NumPy cannot read it (a
    ragged list, a JAX PRNG key): NumPy's own error named neither the key nor the call."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as err:
        problems.add(
            type(err),
            f"{kind} {key!r} must be an array of numbers, got {describe(value)}, which NumPy "
            f"cannot read ({err})",
        )
        return None


def bucketize(arr: np.ndarray, num_buckets: int | None) -> tuple[np.ndarray, np.ndarray]:
    """`(counts, edges)`: an equal-width histogram as TensorFlow builds it (30 buckets default)."""
    flat = np.asarray(arr, dtype=np.float64).reshape(-1)
    buckets = int(num_buckets or DEFAULT_NUM_BUCKETS)
    low, high = float(flat.min()), float(flat.max())
    if low == high:
        edges = np.asarray([low - 0.5, high + 0.5])
        if edges[0] == edges[1]:  # 0.5 below the value's float spacing (1e18 gave [1e18, 1e18])
            with np.errstate(over="ignore"):
                edges = np.nextafter(edges, [-math.inf, math.inf])
            edges[np.isinf(edges)] = low  # float64's largest: no inf edge
        return np.asarray([flat.size], dtype=np.int64), edges
    if math.isinf(high - low):  # a range past float64's: split its halves (no inf edges)
        edges = np.linspace(low / 2, high / 2, buckets + 1) * 2
        edges[0], edges[-1] = low, high
        return np.histogram(flat, bins=edges)[0].astype(np.int64), edges
    try:
        counts, edges = np.histogram(flat, bins=buckets, range=(low, high))
    except ValueError:  # a range float64 cannot split into `buckets` distinct edges: one bucket
        return np.asarray([flat.size], dtype=np.int64), np.asarray([low, high])
    return counts.astype(np.int64), edges
