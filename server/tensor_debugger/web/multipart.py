"""Stream a multipart/form-data request body to disk, part by part, never holding a file in memory.

Every request is bounded before it costs more than a little memory (`MultipartLimits`, from the settings): the
size of one part's header line, the number of parts, the number of runs (distinct file fields) and the bytes of
all text fields together. Past any of them the request is refused (TooLargeError, 413, naming the setting), what
was written of it removed.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from multipart import MultipartError, MultipartSegment, ParserLimitReached, PushMultipartParser

from tensor_debugger.errors import DiskFullError, InvalidInputError, TooLargeError, is_disk_full
from tensor_debugger.ingest.staging import new_folder
from tensor_debugger.settings import ENV_PREFIX, Settings
from tensor_debugger.store.catalog import MAX_LABEL

MAX_FIELD_BYTES = 64 * 1024  # one text field (notes take 64 Ki characters)
_UNSAFE = re.compile(r"[\x00-\x1f/\\]")


@dataclass(frozen=True)
class MultipartLimits:
    """What one multipart request may hold (the settings of the same names)."""

    max_part_header_bytes: int = 4096
    max_upload_parts: int = 1024
    max_upload_runs: int = 64
    max_form_text_bytes: int = 1024 * 1024

    @classmethod
    def of(cls, settings: Settings) -> MultipartLimits:
        return cls(
            settings.max_part_header_bytes,
            settings.max_upload_parts,
            settings.max_upload_runs,
            settings.max_form_text_bytes,
        )

    def refusal(self, name: str, what: str) -> TooLargeError:
        """The error of a request past the limit `name` (a field of this class, and a setting)."""
        return TooLargeError(f"{what}: the limit is {name}={getattr(self, name)} ({ENV_PREFIX}{name.upper()})")


@dataclass(frozen=True)
class UploadedFile:
    field: str  # the form field: the run it belongs to
    filename: str  # as the browser sent it (base name only)
    path: Path


@dataclass
class UploadBatch:
    """Text fields and files of one request; `folder` holds the files until `discard` removes it."""

    folder: Path
    fields: dict[str, str] = field(default_factory=dict)
    files: list[UploadedFile] = field(default_factory=list)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def parse_boundary(content_type: str) -> str:
    found = re.search(r'boundary="?([^";,]+)"?', content_type)
    if not content_type.lower().startswith("multipart/form-data") or found is None:
        raise InvalidInputError("expected a multipart/form-data body with a boundary")
    return found.group(1)


def safe_filename(raw: str) -> str:
    """The base name of an uploaded file, without path separators or control characters."""
    name = _UNSAFE.sub("_", raw.replace("\\", "/").rsplit("/", 1)[-1]).strip().lstrip(".")
    return name[:200] or "upload"


async def receive_multipart(
    content_type: str, chunks: AsyncIterator[bytes], staging: Path, limits: MultipartLimits
) -> UploadBatch:
    """Write every file part to its own file under a new folder in `staging`; collect text fields. Refuses
    (TooLargeError) a request past `limits`, InvalidInputError one that is not multipart or names a run with
    more than 200 characters."""
    boundary = parse_boundary(content_type)
    batch = UploadBatch(new_folder(staging, "upload"))
    out: IO[bytes] | None = None
    text: bytearray | None = None
    text_bytes = 0
    runs: set[str] = set()
    segment: MultipartSegment | None = None
    try:
        with PushMultipartParser(
            boundary,
            max_header_size=limits.max_part_header_bytes,
            max_header_count=16,
            max_segment_count=limits.max_upload_parts,
        ) as parser:
            async for chunk in chunks:
                for event in parser.parse(chunk):
                    if isinstance(event, MultipartSegment):
                        segment = event
                        if event.filename is not None and not event.filename.strip():
                            continue  # a file input left empty: its (empty) body is ignored
                        if event.filename is not None:
                            _check_run(event.name or "", runs, limits)
                            folder = batch.folder / str(len(batch.files))
                            folder.mkdir()
                            upload = UploadedFile(
                                event.name or "", safe_filename(event.filename), folder / safe_filename(event.filename)
                            )
                            batch.files.append(upload)
                            out = open(upload.path, "wb")  # noqa: ASYNC230 (local disk, small writes)
                        else:
                            text = bytearray()
                    elif event is None:
                        if out is not None:
                            out.close()
                            out = None
                        elif text is not None and segment is not None:
                            batch.fields[segment.name or ""] = text.decode("utf-8", errors="replace")
                            text = None
                    elif out is not None:
                        out.write(event)
                    elif text is not None:
                        text.extend(event)
                        text_bytes += len(event)
                        if len(text) > MAX_FIELD_BYTES:
                            raise InvalidInputError(
                                f"form field {segment.name if segment else ''!r} is too long (over {MAX_FIELD_BYTES} "
                                "bytes)"
                            )
                        if text_bytes > limits.max_form_text_bytes:
                            raise limits.refusal("max_form_text_bytes", "the upload's text fields are too large")
            for _ in parser.parse(b""):
                pass
    except ParserLimitReached as exc:
        batch.discard()
        raise _limit_reached(exc, limits) from None
    except MultipartError as exc:
        batch.discard()
        raise InvalidInputError(f"malformed multipart body: {exc}") from None
    except BaseException as exc:
        batch.discard()
        if is_disk_full(exc):
            raise DiskFullError(f"the upload to {staging}") from exc
        raise
    finally:
        if out is not None:
            out.close()
    return batch


def _check_run(field: str, runs: set[str], limits: MultipartLimits) -> None:
    """A file part's field, its run's label: at most MAX_LABEL characters, and at most max_upload_runs of them."""
    if len(field) > MAX_LABEL:
        raise InvalidInputError(
            f"a run label (a file field's name) takes at most {MAX_LABEL} characters, not {len(field)}"
        )
    if field not in runs:
        if len(runs) >= limits.max_upload_runs:
            raise limits.refusal("max_upload_runs", f"the upload has more than {limits.max_upload_runs} runs")
        runs.add(field)


def _limit_reached(exc: ParserLimitReached, limits: MultipartLimits) -> TooLargeError:
    """The parser's own limit (its messages: "Maximum segment count exceeded", "... segment header length ...",
    "... segment header count ..."), named as the setting that sets it."""
    message = str(exc).lower()
    if "header count" in message:
        return TooLargeError("a part of the upload has more than 16 header lines")
    if "header" in message:
        return limits.refusal("max_part_header_bytes", "a part's header line is too long")
    return limits.refusal("max_upload_parts", f"the upload has more than {limits.max_upload_parts} parts")
