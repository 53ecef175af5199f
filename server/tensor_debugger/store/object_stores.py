"""Arrays in S3-compatible object storage: the store URL `s3://BUCKET/PREFIX`, reached through obstore (the
`cluster` extra) and Zarr's `ObjectStore` over it.

The endpoint and credentials come from the standard AWS variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, and `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint
such as a MinIO or SeaweedFS on the local network; `AWS_UNSIGNED_PAYLOAD=true` signs requests without a hash of their
bodies, for an https endpoint, whose TLS already guards them). Ingest uploads the chunk objects of each block
concurrently (store/object_writes.py); a comparison or a slice fetches only the chunks its region covers, concurrently
(store/object_chunks.py, over the same obstore store; Zarr for layouts it does not read). The
store is tried once when it is opened: a missing bucket, refused credentials or an endpoint that does not answer
is an error naming the setting to change, before any work starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, cast
from urllib.parse import urlparse

from tensor_debugger.errors import StoreUnavailableError

if TYPE_CHECKING:
    from obstore.store import RetryConfig, S3Config, S3Store
    from zarr.abc.store import Store

STORE_SETTING = "TENSOR_DEBUGGER_STORE_URL"
# the AWS variable -> obstore's S3 configuration key
_AWS_CONFIG = {
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_REGION": "region",
}
_TRUE = ("1", "true", "yes", "on")


def aws_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The AWS_* variables of `environ`: what another process needs to reach the same S3 store."""
    return {name: value for name, value in environ.items() if name.startswith("AWS_")}


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET/PREFIX` (the prefix may be empty)."""
    parsed = urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    if parsed.scheme != "s3" or not bucket:
        raise StoreUnavailableError(f"{STORE_SETTING}={url!r} is not an s3://BUCKET/PREFIX URL")
    return bucket, prefix


def open_s3_store(url: str, environ: Mapping[str, str], bucket: S3Store | None = None) -> Store:
    """The Zarr store of `s3://BUCKET/PREFIX` over `bucket` (`open_s3_bucket`'s, opened here if not given)."""
    from zarr.storage import ObjectStore

    return ObjectStore(bucket if bucket is not None else open_s3_bucket(url, environ))


def open_s3_bucket(url: str, environ: Mapping[str, str], retry_seconds: float | None = None) -> S3Store:
    """The obstore store of `s3://BUCKET/PREFIX`, configured from the AWS variables in `environ`, once a listing of
    its prefix has succeeded. A request that meets no connection, a timeout or a 5xx answer is tried again for up to
    `retry_seconds` (Settings.store_retry_seconds; None: obstore's own 180 s), at most 10 times."""
    bucket, prefix = parse_s3_url(url)
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError as exc:
        raise StoreUnavailableError(
            f"{STORE_SETTING}={url!r} needs obstore, which the cluster extra installs: "
            f"pip install 'tensor-debugger[cluster]' ({exc})"
        ) from None
    values = {key: environ[name] for name, key in _AWS_CONFIG.items() if environ.get(name)}
    if "region" not in values and environ.get("AWS_DEFAULT_REGION"):
        values["region"] = environ["AWS_DEFAULT_REGION"]
    config = cast("S3Config", values)
    if environ.get("AWS_UNSIGNED_PAYLOAD", "").lower() in _TRUE:
        # requests signed without a SHA-256 of their body (`UNSIGNED-PAYLOAD`): neither side hashes what is uploaded
        # (bench/cluster.py on SeaweedFS: about 15% less CPU in the ingest and 7% less in the server)
        config["unsigned_payload"] = True
    allow_http = environ.get("AWS_ALLOW_HTTP", "").lower() in _TRUE
    try:
        store = S3Store(
            bucket,
            prefix=prefix or None,
            config=config,
            client_options={"allow_http": allow_http},
            retry_config=_retries(retry_seconds),
        )
        obstore.list(store, chunk_size=1).__next__()
    except StopIteration:  # an empty prefix: the bucket is there and answers
        pass
    except Exception as exc:  # obstore raises its GenericError for most HTTP answers: the text says which
        raise StoreUnavailableError(_explain(url, bucket, config.get("endpoint", ""), allow_http, exc)) from None
    return store


def _retries(seconds: float | None) -> RetryConfig:
    """obstore's retry settings: its own defaults (10 tries again, waits from 0.1 s doubling up to 15 s between
    them), but for how long a request is tried again in all, `seconds` (None: its default, 3 minutes)."""
    return {
        "max_retries": 10,
        "retry_timeout": timedelta(seconds=180 if seconds is None else seconds),
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15), "base": 2},
    }


def _explain(url: str, bucket: str, endpoint: str, allow_http: bool, exc: Exception) -> str:
    """What went wrong opening the store, naming the setting to look at, and obstore's own words (first line)."""
    text = str(exc)
    detail = text.splitlines()[0][:300] if text else type(exc).__name__
    where = f"{STORE_SETTING}={url}" + (f" at AWS_ENDPOINT_URL={endpoint}" if endpoint else "")
    if "NoSuchBucket" in text or re.search(r"\b404\b", text):
        reason = f"bucket {bucket!r} does not exist (create it, or name another in {STORE_SETTING})"
    elif any(code in text for code in ("SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied")) or re.search(
        r"\b40[13]\b", text
    ):
        reason = f"the credentials were refused for bucket {bucket!r} (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
    elif endpoint.startswith("http://") and not allow_http:
        reason = "AWS_ENDPOINT_URL is plain http: set AWS_ALLOW_HTTP=true to allow it"
    else:
        reason = "the store did not answer (AWS_ENDPOINT_URL, AWS_REGION, the network)"
    return f"cannot open the array store {where}: {reason}; {detail}"


def is_refusal(exc: Exception) -> bool:
    """Whether a failed request was answered with a refusal (a 4xx status: access denied, no such bucket, a bad
    request), which retrying does not mend; otherwise the store did not answer (no connection, a timeout, a 5xx)."""
    text = str(exc)
    return "NoSuchBucket" in text or "AccessDenied" in text or re.search(r"status code: 4\d\d\b", text) is not None


def describe_failure(exc: Exception) -> str:
    """A failed request in a few words: what S3 answered (its status, and what that means here) or why it never
    did, and obstore's own first line, without the response body it quotes."""
    text = str(exc)
    first = (text.splitlines()[0] if text else type(exc).__name__).split(": <?xml", 1)[0][:300]
    if "NoSuchBucket" in text:
        return f"the bucket no longer exists ({first})"
    if "AccessDenied" in text or re.search(r"status code: 403\b", text):
        return f"access denied: these credentials may not write to the bucket ({first})"
    return first
