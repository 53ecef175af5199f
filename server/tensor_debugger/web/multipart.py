"""Stream a multipart/form-data request body to disk, part by part, never holding a file in memory."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from multipart import MultipartSegment, ParserError, PushMultipartParser

from tensor_debugger.errors import DiskFullError, InvalidInputError, is_disk_full
from tensor_debugger.ingest.staging import new_folder

MAX_FIELD_BYTES = 64 * 1024
_UNSAFE = re.compile(r"[\x00-\x1f/\\]")


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


async def receive_multipart(content_type: str, chunks: AsyncIterator[bytes], staging: Path) -> UploadBatch:
    """Write every file part to its own file under a new folder in `staging`; collect text fields."""
    batch = UploadBatch(new_folder(staging, "upload"))
    out: IO[bytes] | None = None
    text: bytearray | None = None
    segment: MultipartSegment | None = None
    try:
        with PushMultipartParser(parse_boundary(content_type), max_header_count=16) as parser:
            async for chunk in chunks:
                for event in parser.parse(chunk):
                    if isinstance(event, MultipartSegment):
                        segment = event
                        if event.filename is not None and not event.filename.strip():
                            continue  # a file input left empty: its (empty) body is ignored
                        if event.filename is not None:
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
                        if len(text) > MAX_FIELD_BYTES:
                            raise InvalidInputError(f"form field {segment.name if segment else ''!r} is too long")
            for _ in parser.parse(b""):
                pass
    except ParserError as exc:
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
