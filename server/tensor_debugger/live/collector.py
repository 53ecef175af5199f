"""Python's cyclic garbage collector during a capture: the objects that exist when it starts left alone."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def existing_objects_frozen() -> Iterator[None]:
    """While the block runs, the cyclic garbage collector leaves alone the objects that exist when it starts
    (`gc.freeze`): a capture makes many small objects (summaries, names, rows), and each full collection they set
    off would otherwise walk every object of the process, the user's too (a notebook with transformers imported
    holds some 400,000: about 0.1 s a collection). Objects made in the block are collected as usual; at its end the
    frozen ones go back to the oldest generation (`gc.unfreeze`), collected as before. Where something else has
    frozen objects already, or the collector is off, nothing is changed."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
