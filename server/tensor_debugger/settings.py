"""Settings, declared once as data (name, default, help) and built explicitly: nothing is read at import time."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tensor_debugger.engine.fused import Kernel

ENV_PREFIX = "TENSOR_DEBUGGER_"
GiB = 1024**3
MIN_TOKEN_LENGTH = 16


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """The per-user data directory: $XDG_DATA_HOME/tensor-debugger, else ~/.local/share/tensor-debugger."""
    base = environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tensor-debugger"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which taskset, cgroups' cpusets and container runtimes
    narrow), else all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _setting(default: Any, help: str, secret: bool = False, shown: str | None = None) -> Any:
    """A setting's field; a secret one is left out of the settings' repr (and so of logs and tracebacks); `shown`:
    its default in words, where the command line chooses another than the field's."""
    return field(default=default, metadata={"help": help, "shown": shown}, repr=not secret)


@dataclass(frozen=True)
class Settings:
    """Everything the app and the CLI can be configured with. Each field is also the environment variable
    TENSOR_DEBUGGER_<NAME> (upper case), or TENSOR_DEBUGGER_<NAME>_FILE naming a file that holds its value (a
    secret); `--data-dir` and `--workers` on the command line."""

    data_dir: Path = _setting(
        Path("."),
        "Folder holding the SQLite metadata file and the Zarr arrays.",
        shown="$XDG_DATA_HOME/tensor-debugger, else ~/.local/share/tensor-debugger",
    )
    database_url: str = _setting(
        "", "SQLAlchemy URL of the metadata database; empty means sqlite:///<data_dir>/metadata.sqlite3."
    )
    store_url: str = _setting(
        "",
        "Zarr store URL for tensor arrays: file:///folder, or s3://bucket/prefix with the AWS_* variables (the "
        "cluster extra); empty means file://<data_dir>/arrays.",
    )
    host: str = _setting("127.0.0.1", "Address `serve` binds to. Loopback only unless told otherwise.")
    port: int = _setting(8000, "Port `serve` listens on.")
    allowed_hosts: str = _setting(
        "",
        "More host names the server answers to, comma-separated, besides localhost, 127.0.0.1, [::1] and `host` "
        "(`.example.org` also allows its subdomains; `*` allows any name). Other Host headers are refused.",
    )
    token: str = _setting(
        "",
        "Bearer token the API requires and the login page asks for (at least 16 characters); `serve` on an "
        "address other than loopback refuses to start without it unless given `--no-auth`.",
        secret=True,
    )
    read_token: str = _setting(
        "", "A second token that opens every page, the API's reads and exports, and changes nothing.", secret=True
    )
    trusted_proxies: str = _setting(
        "",
        "Addresses of reverse proxies whose X-Forwarded-Proto and X-Forwarded-For are believed, comma-separated "
        "(`*`: any); a request they mark https gets https's origin and a Secure cookie. Empty: none, not even "
        "loopback (a local process could otherwise claim any address).",
    )
    public_url: str = _setting(
        "",
        "The address users reach this server at (https://debugger.example.org, or the port a container publishes): "
        "the links the command line prints lead there; empty means http://host:port as `serve` binds them.",
    )
    address_file: str = _setting(
        "server.json",
        "Name of the file in the data dir where a running server says where the command line finds it; give each "
        "server that shares a data dir (replicas on one volume) a name of its own.",
    )
    demo: bool = _setting(True, "Generate the demo session on the first start of a new data directory.")
    max_upload_bytes: int = _setting(64 * GiB, "Largest request body an upload may send, in bytes.")
    max_part_header_bytes: int = _setting(
        4096,
        "Longest header line of one part of a multipart upload, in bytes: its Content-Disposition, which carries the "
        "run label (at most 200 characters, as names) and the file name.",
    )
    max_upload_parts: int = _setting(
        1024, "Most parts (files and text fields) one multipart upload may hold; a run may be several files."
    )
    max_upload_runs: int = _setting(64, "Most runs (distinct file fields) one multipart upload may create.")
    max_form_text_bytes: int = _setting(
        1024 * 1024, "Most bytes all the text fields of one multipart upload may hold together (a name, notes)."
    )
    max_archive_members: int = _setting(20_000, "Most archive members one run may hold, nested archives' included.")
    max_expanded_bytes: int = _setting(
        256 * GiB, "Most bytes one run's archives may expand to, nested archives' included."
    )
    max_expansion_ratio: float = _setting(
        200.0, "Most a run's archives may expand relative to the outermost one's size, once past expansion_floor_bytes."
    )
    expansion_floor_bytes: int = _setting(GiB, "Expanded size below which the expansion ratio is not checked.")
    staging_sweep_seconds: int = _setting(
        300, "How often a server removes staging folders and runs left by killed processes, in seconds."
    )
    chunk_bytes: int = _setting(1024 * 1024, "Target size of one stored Zarr chunk, in bytes.")
    direct_writes: bool = _setting(
        True,
        "Write a data dir's chunk files past each run's first buffered_run_bytes around the page cache (O_DIRECT) "
        "where its file system allows; false writes them all through the cache (a disk much slower than memory).",
    )
    buffered_run_bytes: int = _setting(
        256 * 1024 * 1024, "Bytes of each run written through the page cache before the rest go around it."
    )
    ingest_workers: int = _setting(
        2, "How many uploaded runs the server ingests at once (each with `workers` threads); more wait their turn."
    )
    ingest_memory: int = _setting(
        0,
        "Most memory one ingest's process may take, in bytes (enforced by the OS: RLIMIT_DATA); a file that needs "
        "more fails with that reason, the other files of its run go on. 0 means a quarter of the machine's memory.",
        shown="0 (a quarter of the machine's memory)",
    )
    ingest_seconds: float = _setting(
        3600.0,
        "Longest one ingest of the server may take, in seconds (a process started for it counts from its start): "
        "past it its process is ended and its run fails with that reason, naming the file it was reading.",
    )
    workers: int = _setting(
        0,
        "Threads that compare, hash, summarise, compress and write tensors; 0 means one per CPU this process may "
        "run on (os.sched_getaffinity). Results are the same for any value.",
    )
    claim_seconds: float = _setting(
        30.0,
        "How long work a process has claimed (pending pairs, a run it ingests) stays its own without renewal; "
        "a process renews its claims every third of this, and others take over those of one that died after it.",
    )
    compare_idle_seconds: float = _setting(
        5.0,
        "How often the server's comparison worker looks for pending pairs when nothing woke it (an upload, a "
        "user's action wakes it at once), in seconds: what another process left pending is picked up within it.",
    )
    store_retry_seconds: float = _setting(
        180.0,
        "How long one request to an s3:// array store is tried again (no connection, a timeout, a 5xx answer: at "
        "most 10 tries again, waiting longer each time) before the store counts as not answering, in seconds; an "
        "ingest or a comparison that meets it waits and tries again later, a page or the API answers 503.",
    )
    outage_retry_seconds: float = _setting(
        60.0,
        "Longest wait between two tries of an ingest or a comparison that met an outage (the database or the array "
        "store did not answer), in seconds: the first try again comes after 1 s, each further one twice as long "
        "after the last, up to this.",
    )
    dask_scheduler: str = _setting(
        "",
        "Address of a Dask scheduler (tcp://host:8786) whose workers compute pending pairs, reading the same "
        "database and store; empty computes them in this process (the cluster extra).",
    )
    dask_no_worker_seconds: float = _setting(
        60.0,
        "How long a computation on the Dask cluster waits while its scheduler has no worker at all (every one "
        "killed, none started), in seconds: then it stops, its pairs not computed stay pending (a server computes "
        "them once a worker is back, `compare` exits 2 saying so).",
    )

    top: int = _setting(
        8, "How many worst elements (the largest differences) each pair's statistics keep, 0 to 64 (`compare --top`)."
    )

    kernel: str = _setting(
        "compiled",
        "Statistics path: compiled (the kernels and the chunk loop), blocks (the kernels on blocks read "
        "into arrays, no chunk loop) or numpy (neither). For checking a result or measuring.",
    )
    kernel_family: str = _setting(
        "",
        "The compiled kernels' vector family: avx512, avx2 or baseline; empty for the best this CPU runs (one it "
        "does not run is ignored with a warning). For checking a result or measuring.",
    )

    def statistics_kernel(self) -> Kernel:
        """The statistics path these settings choose (`kernel`, `kernel_family`), for one engine instance: the
        services' comparisons and ingest's summaries, and an ingest child's. Imported here: the commands that
        compute nothing (`--help`, `sessions`, an unchanged `compare`) do not import numpy."""
        from tensor_debugger.engine.fused import Kernel

        return Kernel(self.kernel, self.kernel_family)

    def __post_init__(self) -> None:
        if self.kernel not in ("compiled", "blocks", "numpy"):
            raise ValueError(f"setting kernel must be compiled, blocks or numpy, got {self.kernel!r}")
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser().resolve())
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{self.data_dir / 'metadata.sqlite3'}")
        if not self.store_url:
            object.__setattr__(self, "store_url", (self.data_dir / "arrays").as_uri())
        for name in (
            "max_upload_bytes",
            "max_part_header_bytes",
            "max_upload_parts",
            "max_upload_runs",
            "max_form_text_bytes",
            "max_archive_members",
            "max_expanded_bytes",
            "expansion_floor_bytes",
            "chunk_bytes",
            "ingest_workers",
            "staging_sweep_seconds",
            "claim_seconds",
            "compare_idle_seconds",
            "ingest_seconds",
            "store_retry_seconds",
            "outage_retry_seconds",
            "dask_no_worker_seconds",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"setting {name} must be positive")
        if self.address_file in ("", ".", "..") or "/" in self.address_file or "\0" in self.address_file:
            raise ValueError(f"setting address_file must be a file name (no folder), got {self.address_file!r}")
        if self.public_url and not self.public_url.startswith(("http://", "https://")):
            raise ValueError(f"setting public_url must start with http:// or https://, got {self.public_url!r}")
        if self.ingest_memory < 0:
            raise ValueError(
                f"setting ingest_memory must be 0 (a quarter of the memory) or more, got {self.ingest_memory}"
            )
        if self.buffered_run_bytes < 0:
            raise ValueError(f"setting buffered_run_bytes must be 0 or more, got {self.buffered_run_bytes}")
        if not 0 <= self.top <= 64:
            raise ValueError(f"setting top ({ENV_PREFIX}TOP, --top) must be 0 to 64, got {self.top}")
        for name in ("token", "read_token"):
            value = getattr(self, name)
            if value and (len(value) < MIN_TOKEN_LENGTH or value != value.strip()):
                raise ValueError(
                    f"setting {name} ({ENV_PREFIX}{name.upper()}) must be at least {MIN_TOKEN_LENGTH} characters "
                    "without surrounding spaces (e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
                )
        if self.token and self.token == self.read_token:
            raise ValueError(f"{ENV_PREFIX}READ_TOKEN must differ from {ENV_PREFIX}TOKEN")
        if self.workers < 0:
            raise ValueError(
                f"setting workers ({ENV_PREFIX}WORKERS, --workers) must be 0 (one per available CPU) "
                f"or a positive number of threads, got {self.workers}"
            )

    @property
    def threads(self) -> int:
        """How many threads a pool of this process's work uses: `workers`, or with 0 the CPUs available to it."""
        return self.workers or available_cpus()

    @property
    def base_url(self) -> str:
        """Where users reach the server: `public_url`, else http://host:port (loopback for a server bound to every
        address), no trailing slash."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)  # noqa: S104
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    @property
    def ingest_memory_limit(self) -> int:
        """The bytes of memory an ingest's process may take: `ingest_memory`, or with 0 a quarter of the machine's."""
        return self.ingest_memory or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4

    @property
    def auth_required(self) -> bool:
        """Whether requests must carry a token (or the session cookie the login page sets)."""
        return bool(self.token or self.read_token)

    @property
    def staging_dir(self) -> Path:
        """Where uploads and extracted archive members wait while they are ingested."""
        return self.data_dir / "staging"

    def with_overrides(self, **overrides: Any) -> Settings:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from TENSOR_DEBUGGER_* variables, then explicit overrides (command-line flags) on top."""
        env = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {"data_dir": default_data_dir(env)}  # field name -> parsed value, of any field's type
        for f in fields(cls):
            raw = _raw_value(env, ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _parse_value(f.name, raw, type(f.default))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def setting_docs() -> list[tuple[str, str, str]]:
    """(environment variable, default, help) for every setting, for the README and `--help`."""
    return [
        (ENV_PREFIX + f.name.upper(), f.metadata["shown"] or str(f.default), f.metadata["help"])
        for f in fields(Settings)
    ]


def _raw_value(env: Mapping[str, str], variable: str) -> str | None:
    """The variable's value, or the content of the file `<variable>_FILE` names (Docker's and Kubernetes' secrets:
    a password kept out of the environment), its final line break left out. Raises ValueError when both are set or
    the file cannot be read."""
    path = env.get(variable + "_FILE")
    if not path:
        return env.get(variable)
    if env.get(variable):
        raise ValueError(f"{variable} and {variable}_FILE are both set: give one")
    try:
        return Path(path).read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{variable}_FILE={path}: {exc}") from None


def _parse_value(name: str, raw: str, kind: type) -> Any:
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind.__name__}") from exc
    return Path(raw) if kind is type(Path()) else raw
