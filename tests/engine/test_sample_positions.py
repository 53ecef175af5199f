"""The positions a summary samples are splitmix64 of the seed plus the draw's number, modulo the element count: the
numpy computation gives the positions of the plain definition, for every count, without importing numpy.ma (which
np.unique imports: a first compare imported it for this alone)."""

from __future__ import annotations

import random
import subprocess
import sys

from tensor_debugger.engine.summary_compare import SAMPLE_SEED, SAMPLE_SIZE, sample_positions

MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def defined(numel: int) -> list[int]:
    if numel <= SAMPLE_SIZE:
        return list(range(numel))
    return sorted({splitmix64(SAMPLE_SEED + k) % numel for k in range(SAMPLE_SIZE)})


def test_sample_positions_follow_their_definition() -> None:
    rng = random.Random(7)
    counts = [0, 1, SAMPLE_SIZE - 1, SAMPLE_SIZE, SAMPLE_SIZE + 1, 300, 4096, 10**6, 2**40 + 7, 2**63 - 1, MASK - 4]
    counts += [rng.randrange(SAMPLE_SIZE + 1, 10**12) for _ in range(500)]
    for numel in counts:
        positions = sample_positions(numel)
        assert positions == defined(numel), numel
        assert all(type(p) is int for p in positions)
    assert len(sample_positions(10**6)) == SAMPLE_SIZE  # no two draws coincide there


def test_sampling_positions_imports_no_numpy_ma() -> None:
    probe = (
        "import sys\n"
        "from tensor_debugger.engine.summary_compare import sample_positions\n"
        "assert 'numpy.ma' not in sys.modules\n"
        "sample_positions(10**6)\n"
        "print('numpy.ma' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
