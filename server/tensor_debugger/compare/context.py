"""What planning, computing and reports of pairs work with: one frozen context per process (`services.py` builds
it), not the planner; and what each of them derives from a stored tensor (its reference, a result's cache key)."""

from __future__ import annotations

import _thread
import hashlib
import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.engine.fused import Kernel, default_kernel
from tensor_debugger.engine.logical_tensors import TensorRef
from tensor_debugger.engine.metrics import DEFAULT_TOP
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.claims import DEFAULT_LEASE_SECONDS, Claims
from tensor_debugger.store.models import TensorRecord


@dataclass(frozen=True, slots=True)
class CompareContext:
    """`sessions`: the catalog's database; `store`: the arrays; `claims`: this process's, on the pending pairs it
    computes; `pool`: the threads that read and reduce blocks (results do not depend on how many, `workers`);
    `lock`: held while computing, one computation at a time per process (the pool is already parallel); `top`:
    worst elements kept per pair (Settings.top); `kernel`: the statistics path every comparison of this context
    takes (Settings.kernel and Settings.kernel_family; engine/fused.py's Kernel)."""

    sessions: sessionmaker[DbSession]
    store: ArrayStore
    claims: Claims
    pool: ThreadPoolExecutor
    workers: int
    top: int = DEFAULT_TOP
    kernel: Kernel = field(default_factory=Kernel)
    # the lock's class, not `threading.Lock` (a function): Litestar's signature model inspects the Services it injects
    lock: _thread.LockType = field(default_factory=threading.Lock, compare=False)

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


def open_context(
    sessions: sessionmaker[DbSession],
    store: ArrayStore,
    workers: int,
    claims: Claims | None = None,
    top: int = DEFAULT_TOP,
    kernel: Kernel | None = None,
) -> CompareContext:
    """A context with `workers` threads of its own (Settings.threads); `claims`: a new owner with the default lease
    if None; `kernel`: the statistics path (engine/fused.py's default kernel where None)."""
    if workers < 1:
        raise ValueError(f"a comparison needs at least one worker thread, got {workers}")
    pool = ThreadPoolExecutor(workers, thread_name_prefix="compare")
    claims = claims or Claims(sessions, DEFAULT_LEASE_SECONDS)
    return CompareContext(
        sessions, store, claims, pool, workers, top, kernel if kernel is not None else default_kernel()
    )


def cache_key(
    digests_a: Sequence[str], digests_b: Sequence[str], alignment_key: str, tol: Tolerance, exact: bool, top: int
) -> str:
    """A result's key: the sides' contents, the alignment, the tolerance and how many worst elements it keeps."""
    text = json.dumps(
        [list(digests_a), list(digests_b), alignment_key, tol.rtol, tol.atol, tol.ulp, tol.ulp_dtype, exact, top]
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def tensor_ref(t: TensorRecord) -> TensorRef:
    return TensorRef(
        t.id,
        t.name,
        tuple(t.shape),
        t.dtype,
        t.position,
        t.layer,
        t.stage,
        tuple(t.key_path),
        t.digest,
        t.module_path,
        t.place,
        t.parameter,
    )
