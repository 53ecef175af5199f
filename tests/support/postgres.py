"""A private PostgreSQL cluster for the tests, from Debian's `postgresql` package: `initdb` into a temporary folder,
`pg_ctl start` on a free loopback port with its socket in that folder, one database per use, stopped at the end.

PostgreSQL refuses to run as root; as root the cluster runs as the package's `postgres` user, so its folder is a
fresh one under the system's temporary directory (pytest's own are private to root) handed to that user.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.servers import free_port

USER = "tensor_debugger"  # the cluster's superuser, trusted on loopback
# for `pytest.mark.parametrize("database_url", DATABASES, indirect=True)`: the test runs on each metadata database
DATABASES = ["sqlite", "postgresql"]
TEMPLATE = "migrated_template"  # copied by create_database


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: the newest of Debian's /usr/lib/postgresql/*/bin, else PATH; None without."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class PostgresCluster:
    bin_dir: Path
    root: Path  # holds data/, the socket and the log
    port: int = field(default_factory=free_port)
    _names: itertools.count[int] = field(default_factory=itertools.count)
    _migrated: bool = False
    running: bool = False  # started and not paused or stopped since

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def _run(self, args: Sequence[str]) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> PostgresCluster:
        if os.geteuid() == 0:
            postgres = pwd.getpwnam("postgres")
            os.chown(self.root, postgres.pw_uid, postgres.pw_gid)
        data = self.root / "data"
        self._run(["initdb", "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync"])
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server on the cluster's data (again, after `pause`)."""
        # durability off: a test cluster is thrown away (fsync alone costs seconds per test module)
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        data = str(self.root / "data")
        self._run(["pg_ctl", "-D", data, "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"])
        self.running = True

    def pause(self) -> None:
        """Stop the server, keeping its data (an outage: `resume` starts it again); clients' connections drop."""
        self.running = False
        self._run(["pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop"])

    def stop(self) -> None:
        self.running = False
        self._run(["pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "test", migrated: bool = True) -> str:
        """A new database, at the newest schema (a copy of a template migrated once: Alembic's run costs about a
        second a database) or empty; returns its SQLAlchemy URL."""
        name = f"{prefix}_{next(self._names)}"
        template = self._template() if migrated else "template1"
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return self.url(name)

    def migrate_template(self) -> None:
        """Make the migrated template now, not at the first `create_database` (so that it can be made while other
        services start)."""
        self._template()

    def _template(self) -> str:
        if not self._migrated:
            from tensor_debugger.store.database import create_db_engine, upgrade_database

            self._execute(f'CREATE DATABASE "{TEMPLATE}"')
            engine = create_db_engine(self.url(TEMPLATE))
            upgrade_database(engine)
            engine.dispose()  # a template is copied only while nobody is connected to it
            self._migrated = True
        return TEMPLATE

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres", autocommit=True) as c:
            c.execute(sql.encode())  # a literal of ours, not a user's


def start_cluster() -> PostgresCluster | str:
    """A started cluster, or why there cannot be one here (for a skip)."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        return "PostgreSQL is not installed (make test installs Debian's postgresql package)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    root = Path(tempfile.mkdtemp(prefix="tensor-debugger-pg-"))
    root.chmod(0o755)
    try:
        return PostgresCluster(bin_dir, root).start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        return f"a PostgreSQL cluster could not be started: {exc}"
