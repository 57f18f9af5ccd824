"""The project's versioned JSON documents, read and format-checked one way.

Four documents outlive the process that wrote them: the checkpoint manifest, the evidence bundle,
the release record and the W&B run identity. Each carries a ``format`` string
(``lightning_field.<kind>/<n>``) so that a newer version can still read an older file and an older
version refuses a newer one by name instead of misreading it. Reading used to be written four
times, each with its own messages for "missing", "not JSON" and "unknown format"; here it is one
function, and each document declares only what differs: its name, the formats it reads, the keys
it cannot do without, and the error type its callers already catch.

Field-by-field checks stay with each document (a manifest's file entries, a record's sources): they
are the document's meaning, not its envelope.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DocumentError", "DocumentFormat", "check_envelope", "interpreting", "parse_document", "read_document"]


class DocumentError(ValueError):
    """A versioned document is missing, not JSON, of a format this version cannot read, or lacks a key."""


@dataclass(frozen=True)
class DocumentFormat:
    """What a versioned document is called, which formats of it are readable, what it must contain.

    Args:
        title: how messages name the document ("checkpoint manifest", "evidence bundle").
        current: the format this version writes, e.g. ``"lightning_field.evidence/2"``.
        readable: every format this version reads, ``current`` included.
        required: top-level keys without which the document is unreadable.
        missing_hint: appended to the "does not exist" message: how such a file comes to be.
    """

    title: str
    current: str
    readable: tuple[str, ...]
    required: tuple[str, ...] = ()
    missing_hint: str = ""

    def __post_init__(self) -> None:
        if self.current not in self.readable:
            raise ValueError(f"{self.title}: the current format {self.current!r} must be readable")


ErrorFactory = Callable[[str], Exception]


def parse_document(
    text: str | bytes, spec: DocumentFormat, where: str | os.PathLike[str], error: ErrorFactory = DocumentError
) -> dict[str, Any]:
    """The document in ``text`` as a dict, once its envelope checks.

    Raises:
        The exception ``error`` builds (``DocumentError`` by default), with a message naming ``where``,
        when ``text`` is not a JSON object, names an unreadable format, or lacks a required key.
    """
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise error(f"{where}: {spec.title} is not valid JSON ({err})") from None
    return check_envelope(data, spec, where, error)


def check_envelope(
    data: Any, spec: DocumentFormat, where: str | os.PathLike[str], error: ErrorFactory = DocumentError
) -> dict[str, Any]:
    """``data`` (already parsed) as a dict, once its format and required keys check.

    Raises:
        The exception ``error`` builds, naming ``where``, as :func:`parse_document` does.
    """
    if not isinstance(data, Mapping):
        raise error(f"{where}: {spec.title} is not a JSON object")
    fmt = data.get("format")
    if fmt not in spec.readable:
        readable = ", ".join(repr(f) for f in spec.readable)
        raise error(f"{where}: unsupported {spec.title} format {fmt!r}; this version reads {readable}")
    missing = [key for key in spec.required if key not in data]
    if missing:
        raise error(f"{where}: {spec.title} lacks required field(s) {', '.join(missing)}")
    return dict(data)


def read_document(
    path: str | os.PathLike[str], spec: DocumentFormat, error: ErrorFactory = DocumentError
) -> dict[str, Any]:
    """Read and envelope-check the document at a local ``path``.

    Raises:
        The exception ``error`` builds when the file does not exist or cannot be read, and
        everything :func:`parse_document` raises.
    """
    path = Path(path)
    try:
        text = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        hint = f" ({spec.missing_hint})" if spec.missing_hint else ""
        raise error(f"{path}: no {spec.title} here{hint}") from None
    except OSError as err:
        raise error(f"{path}: {spec.title} is unreadable ({err})") from None
    return parse_document(text, spec, path, error)


@contextlib.contextmanager
def interpreting(where: str | os.PathLike[str], error: ErrorFactory = DocumentError) -> Iterator[None]:
    """Reading the fields of a document whose envelope checked: a field of the wrong shape (a list
    where an object belongs, a missing key, text where a number belongs) is a refusal naming the file,
    not a traceback from deep inside the reader. Errors that already name their cause pass through.

    Raises:
        The exception ``error`` builds, naming ``where`` and the field's problem.
    """
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, OverflowError) as err:
        raise error(f"{where}: malformed ({_shape_problem(err)})") from None
    except ValueError as err:
        if type(err) is not ValueError:  # one of the readers' own, named errors
            raise
        raise error(f"{where}: malformed ({_shape_problem(err)})") from None


def _shape_problem(err: BaseException) -> str:
    if isinstance(err, KeyError):
        return f"a required field {err} is missing"
    return f"{type(err).__name__}: {str(err)[:200]}"
