"""The structures the compiled code shares with Python (kernel_structs.h), declared as ctypes structures.

kernel_structs.h is where the C side's layouts are written; each class here declares the same fields in the same
order with the matching ctypes types (every pointer but `const char *` a plain address, c_void_p). Nothing reads
the header at run time: tests/engine/test_kernel_structs.py parses it and checks each class's field names, types,
offsets and size against it, and the libraries' *_size() functions are checked against these classes when they
load (fused.load_library), so a library built from another header is not used.
"""

from __future__ import annotations

import ctypes

TD_EDGES = 16  # histogram edges: |a - b| >= 1e-12, 1e-11, ..., 1e3
TD_TOP = 64  # the most worst elements a partial keeps


class Partial(ctypes.Structure):
    """td_partial (TD_PARTIAL_FIELDS): one block's statistics of a pair, and its worst elements."""

    _fields_ = [
        ("max_abs", ctypes.c_double),
        ("argmax", ctypes.c_int64),
        ("sum_abs", ctypes.c_double),
        ("sum_sq", ctypes.c_double),
        ("sum_rel", ctypes.c_double),
        ("max_rel", ctypes.c_double),
        ("rel_count", ctypes.c_int64),
        ("dot", ctypes.c_double),
        ("norm_a", ctypes.c_double),
        ("norm_b", ctypes.c_double),
        ("mismatched", ctypes.c_int64),
        ("nonzero", ctypes.c_int64),
        ("at_least", ctypes.c_int64 * TD_EDGES),
        ("top_k", ctypes.c_int64),
        ("top_n", ctypes.c_int64),
        ("top_abs", ctypes.c_double * TD_TOP),
        ("top_at", ctypes.c_int64 * TD_TOP),
        ("top_a", ctypes.c_double * TD_TOP),
        ("top_b", ctypes.c_double * TD_TOP),
    ]


class Summary(ctypes.Structure):
    """td_summary (TD_SUMMARY_FIELDS): one block's finite values: count, mean, M2, min, max."""

    _fields_ = [
        ("count", ctypes.c_double),
        ("mean", ctypes.c_double),
        ("m2", ctypes.c_double),
        ("min", ctypes.c_double),
        ("max", ctypes.c_double),
    ]


class Piece(ctypes.Structure):
    """tdc_piece (TDC_PIECE_FIELDS): a stretch of one chunk file, or of a fetched chunk object's bytes."""

    _fields_ = [
        ("path", ctypes.c_char_p),
        ("skip", ctypes.c_int64),
        ("count", ctypes.c_int64),
        ("bytes", ctypes.c_void_p),
        ("size", ctypes.c_int64),
    ]


class Side(ctypes.Structure):
    """tdc_side (TDC_SIDE_FIELDS): one side's pieces of a block, and the thread's buffers."""

    _fields_ = [
        ("pieces", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("chunk_bytes", ctypes.c_int64),
        ("code", ctypes.c_int),
        ("raw", ctypes.c_int),
        ("compressed", ctypes.c_void_p),
        ("decoded", ctypes.c_void_p),
        ("widened", ctypes.c_void_p),
    ]


# Each field list of kernel_structs.h and the class that declares it (the header check's table).
DECLARED: dict[str, type[ctypes.Structure]] = {
    "TD_PARTIAL_FIELDS": Partial,
    "TD_SUMMARY_FIELDS": Summary,
    "TDC_PIECE_FIELDS": Piece,
    "TDC_SIDE_FIELDS": Side,
}
CONSTANTS: dict[str, int] = {"TD_EDGES": TD_EDGES, "TD_TOP": TD_TOP}
