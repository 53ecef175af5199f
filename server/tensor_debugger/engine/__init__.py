"""The pure comparison engine: pairing, alignment, statistics and verdicts.

It imports numpy (and the project's pure modules) only: never the web framework, the database or the array
store. Arrays come in as anything with `shape` and numpy-style `__getitem__` (a Zarr array, a numpy array).
"""
