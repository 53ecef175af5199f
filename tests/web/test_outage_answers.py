"""A database or an array store that stops answering is said as such: the API answers 503 with `Retry-After` and a
detail naming which is down, a page says it in words, and `/healthz` answers 503 until both answer again. Each on a
server of its own over a PostgreSQL cluster or a SeaweedFS server of its own, stopped in the middle of the test."""

from __future__ import annotations

from pathlib import Path

from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support import loopback_http
from tests.support.dumps import make_zip
from tests.support.postgres import PostgresCluster
from tests.support.s3 import QUICK_STORE_RETRIES, SeaweedS3
from tests.support.servers import started_server, upload, wait_done


def test_a_database_outage_answers_503_with_retry_after_and_health_follows_it(
    tmp_path: Path, own_postgres: PostgresCluster
) -> None:
    url = own_postgres.create_database("outage")
    server = started_server(tmp_path, database_url=url.replace("tensor_debugger@", "tensor_debugger:s3cret-password@"))
    try:
        health = loopback_http.get(server.url + "/healthz", timeout=10)
        assert (health.status_code, health.json()) == (200, {"database": "ok", "store": "ok"})

        own_postgres.pause()
        refused = loopback_http.get(server.url + "/api/sessions", timeout=30)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        detail = refused.json()["detail"]
        assert detail.startswith("the database did not answer (postgresql+psycopg://tensor_debugger:***@127.0.0.1:")
        assert "s3cret-password" not in detail
        page = loopback_http.get(server.url + "/", headers={"accept": "text/html"}, timeout=30)
        assert page.status_code == 503
        assert "the database did not answer" in page.text
        health = loopback_http.get(server.url + "/healthz", timeout=30)
        assert (health.status_code, health.json()) == (503, {"database": "did not answer", "store": "ok"})
        assert health.headers["retry-after"] == "5"

        own_postgres.resume()  # the same server, with nothing done to it, answers again
        assert loopback_http.get(server.url + "/api/sessions", timeout=30).status_code == 200
        assert loopback_http.get(server.url + "/healthz", timeout=30).status_code == 200
        assert server.alive()
    finally:
        server.stop()


def test_a_store_outage_answers_503_naming_the_store(tmp_path: Path, own_s3: SeaweedS3) -> None:
    store_url = own_s3.new_url()
    env = {"TENSOR_DEBUGGER_STORE_URL": store_url, **own_s3.environ, **QUICK_STORE_RETRIES}
    server = started_server(tmp_path, env=env)
    try:
        write_dump(tmp_path / "ref", layers=1, seed=3)
        write_dump(tmp_path / "cand", layers=1, seed=3, plant=Plant(0, "post_attn", (2, 3), 0.5))
        files = [("reference", make_zip(tmp_path / "ref", tmp_path / "ref.zip"))]
        files.append(("candidate", make_zip(tmp_path / "cand", tmp_path / "cand.zip")))
        created = upload(server, "outage", files)
        assert created.status_code == 201, created.text
        report = wait_done(server, created.json()["session"]["id"])
        failing = next(p for p in report["pairs"] if p["status"] == "fail")

        own_s3.stop()
        window = loopback_http.get(
            f"{server.url}/api/pairs/{failing['id']}/slice", params={"index": "0,:"}, timeout=120
        )
        assert window.status_code == 503, window.text
        assert window.headers["retry-after"] == "5"
        assert window.json()["detail"].startswith(f"the array store did not answer ({store_url})")
        health = loopback_http.get(server.url + "/healthz", timeout=60)
        assert (health.status_code, health.json()) == (503, {"database": "ok", "store": "did not answer"})
        assert loopback_http.get(server.url + "/api/sessions", timeout=30).status_code == 200  # the rest answers
        assert server.alive()
    finally:
        server.stop()
