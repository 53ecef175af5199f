"""Multipart uploads are bounded, on a real server: a part header past max_part_header_bytes, more runs than
max_upload_runs, more parts than max_upload_parts and text fields past max_form_text_bytes are each refused with
413 naming the limit, a run label past 200 characters with 400; the server's memory (its process's RSS) comes back
near where it was; and one client's many runs do not make another's one run wait behind them all."""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import torch

from tests.support import loopback_http as http
from tests.support.polling import wait_until
from tests.support.servers import LiveServer, started_server, wait_staging_empty

BOUNDARY = "limits0boundary"
MiB = 1024 * 1024


def part(name: str, body: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + body + b"\r\n"


def body_of(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def post_multipart(server: LiveServer, body: bytes, url: str = "/api/sessions") -> httpx.Response:
    return http.post(
        server.url + url,
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
        timeout=120,
    )


def tensor_bytes(seed: int, shape: tuple[int, ...] = (16, 16)) -> bytes:
    buffer = io.BytesIO()
    torch.save({"weight": torch.randn(shape, generator=torch.Generator().manual_seed(seed))}, buffer)
    return buffer.getvalue()


def refused(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    for word in words:
        assert word in response.json()["detail"], response.text


def rss(server: LiveServer) -> int:
    assert server.process is not None
    return int(psutil.Process(server.process.pid).memory_info().rss)


@pytest.fixture
def server(one_ingest_server: LiveServer) -> LiveServer:
    """One ingest at a time, so the order of the ingest queue shows (tests/web/conftest.py's, one per worker)."""
    assert one_ingest_server.alive(), f"the one-ingest server has exited; its log: {one_ingest_server.log}"
    return one_ingest_server


def sessions_named(server: LiveServer, prefix: str) -> list[dict[str, Any]]:
    response = http.get(server.url + "/api/sessions", params={"q": prefix})
    assert response.status_code == 200
    return list(response.json())


def test_a_part_header_past_its_limit_is_413_naming_it_and_nothing_is_kept(server: LiveServer) -> None:
    name = f"header {uuid.uuid4().hex}"
    label = "r" * 5000  # the run label: a 5 KB Content-Disposition line
    response = post_multipart(server, body_of(part("name", name.encode()), part(label, tensor_bytes(1), "a.pth")))
    refused(response, 413, "max_part_header_bytes=4096", "TENSOR_DEBUGGER_MAX_PART_HEADER_BYTES")
    assert sessions_named(server, name) == []
    wait_staging_empty(server)


def test_a_run_label_past_200_characters_is_400(server: LiveServer) -> None:
    name = f"label {uuid.uuid4().hex}"
    response = post_multipart(server, body_of(part("name", name.encode()), part("r" * 201, tensor_bytes(1), "a.pth")))
    refused(response, 400, "at most 200 characters")
    assert sessions_named(server, name) == []
    # 200 characters is a label like any other
    response = post_multipart(server, body_of(part("name", name.encode()), part("r" * 200, tensor_bytes(1), "a.pth")))
    assert response.status_code == 201, response.text
    assert [run["label"] for run in response.json()["session"]["runs"]] == ["r" * 200]


def test_65_runs_are_413_naming_max_upload_runs_and_nothing_is_kept(server: LiveServer) -> None:
    name = f"runs {uuid.uuid4().hex}"
    files = [part(f"run{i}", tensor_bytes(i), f"{i}.pth") for i in range(65)]
    response = post_multipart(server, body_of(part("name", name.encode()), *files))
    refused(response, 413, "max_upload_runs=64", "TENSOR_DEBUGGER_MAX_UPLOAD_RUNS")
    assert sessions_named(server, name) == []
    wait_staging_empty(server)


def test_more_parts_than_max_upload_parts_are_413(server: LiveServer) -> None:
    name = f"parts {uuid.uuid4().hex}"
    # one run of 1,025 files: below max_upload_runs, above max_upload_parts (1,024)
    files = [part("reference", b"x", f"{i}.bin") for i in range(1025)]
    response = post_multipart(server, body_of(part("name", name.encode()), *files))
    refused(response, 413, "max_upload_parts=1024", "TENSOR_DEBUGGER_MAX_UPLOAD_PARTS")
    assert sessions_named(server, name) == []
    wait_staging_empty(server)


def test_text_fields_past_1_mib_are_413_and_the_memory_comes_back(server: LiveServer) -> None:
    http.get(server.url + "/api/sessions")
    before = rss(server)
    field = b"n" * 60_000  # the fields: 60 KB each
    for _ in range(20):  # 20 requests of 1.2 MB of text fields each (a little past the limit)
        fields = [part(f"f{i}", field) for i in range(20)]
        response = post_multipart(server, body_of(*fields, part("reference", tensor_bytes(1), "a.pth")))
        refused(response, 413, "max_form_text_bytes=1048576", "TENSOR_DEBUGGER_MAX_FORM_TEXT_BYTES")

    def streamed() -> Iterator[bytes]:  # the request: 5,000 fields of 60 KB, 300 MB, never held whole
        for i in range(5000):
            yield part(f"f{i}", field)
        yield f"--{BOUNDARY}--\r\n".encode()

    try:
        response = http.post(
            server.url + "/api/sessions",
            content=streamed(),
            headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
            timeout=120,
        )
    except httpx.TransportError:
        pass  # the server answered 413 and closed while the rest was still being sent
    else:
        refused(response, 413, "max_form_text_bytes")
    assert server.alive()
    time.sleep(0.5)
    grown = rss(server) - before
    assert grown < 40 * MiB, f"the server's RSS grew by {grown / MiB:.0f} MiB and stayed"
    wait_staging_empty(server)


def run_statuses(server: LiveServer, session_id: int) -> list[str]:
    response = http.get(f"{server.url}/api/sessions/{session_id}")
    assert response.status_code == 200, response.text
    return [run["status"] for run in response.json()["runs"]]


MANY = 12


def test_one_client_s_many_runs_do_not_hold_up_another_s_one_run(server: LiveServer) -> None:
    big = tensor_bytes(7, (512, 512))  # a megabyte per run: each ingest takes a moment
    # MANY runs: enough that a queue in order of arrival would ingest far more than 3 of them before the other's one
    many = [part(f"run{i}", big, f"{i}.pth") for i in range(MANY)]
    first = post_multipart(
        server, body_of(part("name", f"many {uuid.uuid4().hex}".encode()), *many), "/api/sessions?wait=false"
    )
    assert first.status_code == 202, first.text
    first_id = first.json()["session"]["id"]
    second = post_multipart(
        server,
        body_of(part("name", f"one {uuid.uuid4().hex}".encode()), part("reference", tensor_bytes(8), "a.pth")),
        "/api/sessions?wait=false",
    )
    assert second.status_code == 202, second.text
    second_id = second.json()["session"]["id"]
    wait_until(
        lambda: run_statuses(server, second_id) == ["ready"],
        what="the second client's run to be ingested",
        timeout=120,
        interval=0.02,
    )
    ready_first = run_statuses(server, first_id).count("ready")
    # one ingest at a time: the first's running ingest, then (its turn next) the second's; never all 64 first
    assert ready_first <= 3, f"{ready_first} of the first client's {MANY} runs were ingested before the other's one"
    wait_until(
        lambda: run_statuses(server, first_id).count("ready") == MANY,
        what="the first client's runs to be ingested",
        timeout=300,
        interval=0.05,
    )
    wait_staging_empty(server)


def test_the_limits_are_settings(tmp_path: Path) -> None:
    live = started_server(tmp_path, env={"TENSOR_DEBUGGER_MAX_UPLOAD_RUNS": "2"})
    try:
        files = [part(f"run{i}", tensor_bytes(i), f"{i}.pth") for i in range(3)]
        refused(post_multipart(live, body_of(*files)), 413, "max_upload_runs=2")
        response = post_multipart(live, body_of(*files[:2]))
        assert response.status_code == 201, response.text
    finally:
        live.stop()
