"""What this machine charges for writing files through the page cache, by how long ago the memory was freed.

    python bench/page_cache_touch.py                    # 400 files of 1 MiB, 3 rounds, 15 s apart
    python bench/page_cache_touch.py --mib 400 --rounds 5 --wait 20 --folder /tmp

A cold first compare of 2 x 200 MB writes about 400 MB of chunk files through the page cache, and a whole-process
profile of it (`reading_split.py --whole`) puts the kernel's copy into new page-cache pages
(`copy_folio_from_iter_atomic`) at 0.36 to 0.72 CPU s from one compare to the next, for the same bytes. This
measures that copy alone, without the tool: each round writes MIB files of 1 MiB from one kept buffer (as ingest
writes chunk files from its read buffers) into a new folder, three ways in turn: once just after as many bytes of
another folder were deleted ("just freed": the kernel hands back pages freed a moment ago), once WAIT seconds after
such a delete ("freed WAIT s before"), and, as a control for the wait itself, once after WAIT idle seconds and then
the delete ("idle WAIT s, then just freed"). The question it asks: on a virtual machine whose balloon device
reports free pages to its host (virtio-balloon's free page reporting, printed here when the device says so), does a
page that stayed free a few seconds cost the host's fault at its first write, inside the copy? (RESULTS.md,
2026-11-29: not confirmed here.) Prints the CPU seconds (this process's, user and system) of each write, by round,
and the medians; nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from harness import machine_line

MiB = 1 << 20


def free_page_reporting() -> str:
    """What the virtio balloon device (virtio device id 5) says of free page reporting (feature bit 5)."""
    for device in Path("/sys/bus/virtio/devices").glob("*"):
        try:
            if int((device / "device").read_text(), 16) != 5:
                continue
            features = (device / "features").read_text().strip()
        except OSError:
            continue
        on = len(features) > 5 and features[5] == "1"
        return f"virtio-balloon free page reporting {'on' if on else 'off'}"
    return "no virtio-balloon device"


def write_files(folder: Path, count: int, buffer: memoryview) -> float:
    """`count` files of 1 MiB from `buffer` into `folder` (made here); the CPU seconds it took."""
    folder.mkdir()
    start = time.process_time()
    for index in range(count):
        fd = os.open(folder / f"c.{index}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, buffer[(index % 4) * MiB : (index % 4 + 1) * MiB])
        finally:
            os.close(fd)
    return time.process_time() - start


def freed(folder: Path, count: int, buffer: memoryview) -> None:
    """Write then delete `count` MiB at `folder`: that many pages freed now."""
    write_files(folder, count, buffer)
    os.sync()
    shutil.rmtree(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=400, help="files of 1 MiB written a round (default 400)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wait", type=float, default=15.0, help="seconds between the delete and the later write")
    parser.add_argument("--folder", type=Path, default=None, help="where to write (default: the temporary folder)")
    args = parser.parse_args()
    buffer = memoryview(bytearray(os.urandom(4 * MiB)))
    work = Path(tempfile.mkdtemp(prefix="page-cache-touch-", dir=args.folder))
    print(machine_line(free_page_reporting()))
    print(f"{args.mib} files of 1 MiB a write, in {work}; load {os.getloadavg()[0]:.1f} at the start")
    ways = ("just freed", f"freed {args.wait:g} s before", f"idle {args.wait:g} s, then just freed")
    cpus: dict[str, list[float]] = {way: [] for way in ways}
    try:
        for round_index in range(args.rounds):
            for way in ways[round_index % 3 :] + ways[: round_index % 3]:
                if way == ways[2]:
                    time.sleep(args.wait)
                freed(work / "before", args.mib, buffer)
                if way == ways[1]:
                    time.sleep(args.wait)
                cpus[way].append(write_files(work / "timed", args.mib, buffer))
                os.sync()
                shutil.rmtree(work / "timed")
        for way in ways:
            by_round = " ".join(f"{c:.3f}" for c in cpus[way])
            print(f"{way:>32}: CPU s median {statistics.median(cpus[way]):.3f}; by round {by_round}")
        print(f"load {os.getloadavg()[0]:.1f} at the end")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
