"""Time to the first answer: `tensor-debugger compare` against the throw-away script a user would write.

    python bench/first_answer.py                         # 2 x 200 MB of float32 .pth, 32 files per run, in zips
    python bench/first_answer.py --large                 # 2 x 2 GiB in folders, one round (minutes)
    python bench/first_answer.py --baseline /elsewhere/server   # also time another checkout's CLI, in turn
    python bench/first_answer.py --variant direct:TENSOR_DEBUGGER_BUFFERED_RUN_BYTES=0   # and with these settings
    python bench/first_answer.py --cold --form folders --size-mb 4096   # cold page cache, bytes read (root)
    python bench/first_answer.py --cold --form folders --size-mb 4295 --cgroup-memory 1G   # in a memory cgroup

Two runs of `{layer}_{stage}.pth` files (the candidate differs from the reference from layer 1 on) are written
once, as zip archives (members stored, as `zip -0` and most tools writing .pth dumps do) or folders. Then, in each
round and in turn:
- the plain script: `torch.load` of each file pair, float64 statistics (max and mean |diff|, cosine), the first
  pair outside torch.testing's float32 tolerance (the peer users would pick);
- the CLI cold: `tensor-debugger compare A B --json` into a new data dir;
- the CLI again: the same command on the same files and data dir (an answer kept by the first: `cli/answers.py`),
  then once more, untimed, under `python -X importtime`: the seconds of all its imports and of the heavy ones
  (SQLAlchemy, numpy, torch, Zarr, the services and the comparison machinery; 0 where not imported);
- the CLI warm, and warm again: the same two with `tensor-debugger serve` already running on another new data dir
  (started before the clock starts), which the command hands the work to (the warm path; for it, the peak RSS is
  the command's own, not the server's);
- with `--baseline DIR`, the same two again with the package found in DIR (another checkout's `server/` folder,
  its compiled libraries built, its `migrations/` beside it), so that a change is timed beside the code before it;
- with `--variant LABEL:VAR=VALUE[,VAR=VALUE...]` (as often as wanted), the same two again with these settings in
  the environment (`TENSOR_DEBUGGER_*`, which every other way runs without), so that a setting's default is
  weighed in turn with it, on the same machine.
With `--cold` (root only: it writes /proc/sys/vm/drop_caches), each round times the script and the CLI cold only,
each after `sync` and dropping the page cache, and says the bytes each read from and wrote to the disk: the
`read_bytes` and `write_bytes` of /proc/<pid>/io of a wrapper process, which the kernel adds its waited-for
children's to (the whole process tree's), less the wrapper's own before it started the command; the CLI runs with
`--verbose`, whose line says how many pairs were compared from the bytes as they were ingested and how many were
read back from the store (a `--baseline` checkout that lacks it is run without). With `--cgroup-memory SIZE` (and
`--cold`), each command runs in a new memory cgroup of its own under this process's (cgroup v2's `memory.max`, or
v1's `memory.limit_in_bytes` where the memory controller is v1's), made for it and removed after: the table says
whether it completed or was killed, and the group's peak (`memory.peak`, v1: `memory.max_usage_in_bytes`), which
counts the page cache the command filled as well as its processes' memory (the kernel reclaims that cache at the
limit before it kills anything).
Each is a child process, started once the machine has written back what came before (`sync`); the figures are
wall seconds, CPU seconds (user and system: steadier than wall time on a loaded machine) and the child's peak RSS
(its largest process's). Nothing asserts on timings. The ways after the script take turns at going first: on this
VM, whichever command comes right after the script spends 3-5 s more of system time writing 2 x 2 GiB than the
next (cold then warm: 15.6 s then 8.5 s; warm then cold: 11.5 s then 7.9 s), so one round (`--large`) favours the
ways after the first; over several rounds (`--size-mb 2147 --form folders --rounds 3`) each goes first in turn.
The packages timed (this checkout's, a `--baseline`'s) are compiled to bytecode first (`harness.compile_package`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness import child_env, compile_package, machine_line, run_child, run_child_cpu, zipped

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / ".venv" / "bin" / "tensor-debugger"
PYTHON = ROOT / ".venv" / "bin" / "python"
STAGES = ("post_ln_pre_attn", "query", "key", "value", "post_attn", "post_attn_pre_resid", "pre_mlp", "post_mlp")
HIDDEN = 1024

SCRIPT = r"""
import io, sys, time, zipfile
from pathlib import Path
import torch

def members(path):
    path = Path(path)
    if path.is_dir():
        return {p.name: p.read_bytes for p in sorted(path.iterdir())}
    archive = zipfile.ZipFile(path)
    return {Path(n).name: (lambda n=n: archive.read(n)) for n in archive.namelist() if n.endswith(".pth")}

a, b = members(sys.argv[1]), members(sys.argv[2])
stages = sys.argv[3].split(",")
first = None
for name in sorted(a, key=lambda n: (int(n.split("_")[0]), stages.index(n[:-4].split("_", 1)[1]))):
    x = torch.load(io.BytesIO(a[name]()), weights_only=True).double()
    y = torch.load(io.BytesIO(b[name]()), weights_only=True).double()
    diff = (y - x).abs()
    cosine = torch.nn.functional.cosine_similarity(x.flatten(), y.flatten(), dim=0).item()
    bad = (diff > 1e-5 + 1.3e-6 * x.abs()).sum().item()
    if bad and first is None:
        first = name
    print(name, diff.max().item(), diff.mean().item(), cosine, bad)
print("FIRST", first)
"""


def write_runs(folder: Path, size_mb: int, files: int) -> None:
    """Write the two runs' files (in a child: this process stays free of torch)."""
    import torch

    per_file = size_mb * 1_000_000 // files
    rows = max(1, per_file // (HIDDEN * 4))
    generator = torch.Generator().manual_seed(0)
    for run in ("reference", "candidate"):
        (folder / run).mkdir(parents=True)
    for index in range(files):
        layer, stage = divmod(index, len(STAGES))
        name = f"{layer}_{STAGES[stage]}.pth"
        values = torch.randn(rows, HIDDEN, generator=generator)
        torch.save(values, folder / "reference" / name)
        if layer >= 1:
            values = values + 1e-3 * torch.randn(rows, HIDDEN, generator=generator)
        torch.save(values, folder / "candidate" / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200, help="MB of float32 per run")
    parser.add_argument("--files", type=int, default=32, help=".pth files per run")
    parser.add_argument("--form", choices=("archives", "folders"), default="archives")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--large", action="store_true", help="2 x 2 GiB (2048 MiB per run) in folders, one round: --size-mb 2147 ..."
    )
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's server/ folder to time too")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=variant,
        metavar="LABEL:VAR=VALUE[,VAR=VALUE]",
        help="also time the CLI with these environment variables set (cold and again), in turn",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each; bytes read (root)")
    parser.add_argument(
        "--cgroup-memory",
        type=memory_size,
        default=None,
        metavar="SIZE",
        help="with --cold: run each command in a memory cgroup of SIZE bytes (1G, 512M; root)",
    )
    parser.add_argument("--write-runs", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_runs:
        write_runs(Path(args.write_runs[0]), int(args.write_runs[1]), int(args.write_runs[2]))
        return
    if args.large:
        args.size_mb, args.form, args.rounds = 2147, "folders", 1  # 2 GiB
    if args.cgroup_memory is not None and not args.cold:
        parser.error("--cgroup-memory goes with --cold")
    commands = {"compare": [str(CLI)]}
    if args.baseline is not None:
        commands["baseline"] = [
            "/usr/bin/env",
            f"PYTHONPATH={args.baseline.resolve()}",
            str(PYTHON),
            "-m",
            "tensor_debugger",
        ]
    for label, assignments in args.variant:
        if label in commands:
            parser.error(f"--variant {label}: the label is taken")
        commands[label] = ["/usr/bin/env", *assignments, str(PYTHON), "-m", "tensor_debugger"]
    work = Path(tempfile.mkdtemp(prefix="first-answer-", dir=args.workdir))
    env = child_env()
    compile_package(PYTHON, *([args.baseline] if args.baseline is not None else []))
    try:
        run_child([str(PYTHON), __file__, "--write-runs", str(work / "dump"), str(args.size_mb), str(args.files)], env)
        a, b = work / "dump" / "reference", work / "dump" / "candidate"
        if args.form == "archives":
            a, b = zipped(a), zipped(b)
        script = work / "script.py"
        script.write_text(SCRIPT)
        _, _, versions = run_child(
            [str(PYTHON), "-c", "import torch, numpy; print(f'torch {torch.__version__}, numpy {numpy.__version__}')"],
            env,
        )
        print(machine_line(versions.strip()))
        print(
            f"two runs of {args.files} float32 .pth files, {args.size_mb} MB each, as {args.form}; "
            f"{args.rounds} rounds, in turn"
        )
        if args.cold:
            cold_rounds(args, commands, work, script, a, b, env)
            return
        times: dict[str, list[float]] = {"plain script": []}
        times.update({f"{name}, {when}": [] for name in commands for when in ("cold", "again")})
        times.update({"compare, warm": [], "warm, again": []})
        peaks: dict[str, list[float]] = {name: [] for name in times}
        imports: dict[str, list[dict[str, float]]] = {}
        cpu: dict[str, list[float]] = {name: [] for name in times}
        for round_index in range(args.rounds):
            os.sync()  # before each timed command: none pays for writing back what another wrote (the dumps too)
            wall, rss, seconds, out = run_child_cpu([str(PYTHON), str(script), str(a), str(b), ",".join(STAGES)], env)
            times["plain script"].append(wall)
            peaks["plain script"].append(rss)
            cpu["plain script"].append(seconds)
            first_script = out.strip().splitlines()[-1].split()[-1]
            ways = [(name, command, ("cold", "again"), False) for name, command in commands.items()]
            ways.append(("compare", [str(CLI)], ("warm", "again"), True))
            turn = round_index % len(ways)  # which goes first after the script changes from round to round
            for name, command, whens, warm in ways[turn:] + ways[:turn]:
                data = work / f"data-{name}-{'warm' if warm else 'cold'}-{round_index}"
                with serving(data, env) if warm else nothing() as url:
                    for when in whens:
                        label = ("warm, again" if when == "again" else "compare, warm") if warm else f"{name}, {when}"
                        os.sync()
                        wall, rss, seconds, out = run_child_allowing(
                            [*command, "--data-dir", str(data), "compare", str(a), str(b), "--json"], env
                        )
                        times[label].append(wall)
                        peaks[label].append(rss)
                        cpu[label].append(seconds)
                        try:
                            answer = json.loads(out)
                        except ValueError:
                            sys.exit(f"{label} printed no JSON: {out[:2000]}")
                        found = answer["first_divergence"]
                        if found is None or f"{found['name']}.pth" != first_script:
                            sys.exit(f"{label} found {found}, the script {first_script}")
                        if url is not None and not answer["session"]["url"].startswith(url):
                            sys.exit(f"{label}: the server at {url} was not used ({answer['session']['url']})")
                        if when == "again" and not warm:  # once more, untimed, for where its start-up goes
                            imports.setdefault(name, []).append(import_times(command, data, a, b, env))
                shutil.rmtree(data, ignore_errors=True)
        script_median = statistics.median(times["plain script"])
        print(f"{os.getloadavg()[0]:.1f} load average (1 minute) at the end")
        print(f"{'':16} {'median s':>9} {'min s':>7} {'max s':>7} {'x script':>9} {'CPU s':>7} {'peak RSS MB':>12}")
        for name, values in times.items():
            print(
                f"{name:16} {statistics.median(values):9.2f} {min(values):7.2f} {max(values):7.2f} "
                f"{statistics.median(values) / script_median:9.2f} {statistics.median(cpu[name]):7.2f} "
                f"{max(peaks[name]):12.0f}"
            )
        print("CPU s by round: " + "; ".join(f"{name} " + " ".join(f"{c:.3f}" for c in cpu[name]) for name in cpu))
        for name, rounds in imports.items():
            parts = ", ".join(f"{m} {statistics.median(r[m] for r in rounds):.3f}" for m in rounds[0] if m != "total")
            print(
                f"{name}, again, python -X importtime (median s of {len(rounds)}): all imports "
                f"{statistics.median(r['total'] for r in rounds):.3f}; {parts}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


WRAPPER = r"""
import subprocess, sys

def io():
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])

before = io()
with open(sys.argv[2], "wb") as err:
    code = subprocess.run(sys.argv[3:], stderr=err).returncode
after = io()
with open(sys.argv[1], "w") as out:
    out.write(f"{after[0] - before[0]} {after[1] - before[1]} {code}")
sys.exit(code)
"""


def drop_caches() -> None:
    """Write back what is dirty and drop the page cache (and dentries and inodes): the next reads go to disk."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def cold_rounds(
    args: argparse.Namespace,
    commands: dict[str, list[str]],
    work: Path,
    script: Path,
    a: Path,
    b: Path,
    env: dict[str, str],
) -> None:
    """`--cold`: the script and each CLI cold, in turn, each after dropping the page cache; wall and CPU seconds,
    peak RSS, and the bytes the process tree read from and wrote to disk."""
    if os.geteuid() != 0 or not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        sys.exit("--cold drops the page cache: run it as root")
    wrapper = work / "io_wrapper.py"
    wrapper.write_text(WRAPPER)
    inputs = sum(
        p.stat().st_size for side in (a, b) for p in ([side] if side.is_file() else side.rglob("*")) if p.is_file()
    )
    ways: list[tuple[str, list[str]]] = [("plain script", [str(PYTHON), str(script), str(a), str(b), ",".join(STAGES)])]
    for name, command in commands.items():
        verbose = [] if name == "baseline" else ["--verbose"]  # a baseline may lack it
        ways.append(
            (
                f"{name}, cold",
                [*command, "--data-dir", str(work / f"data-{name}"), "compare", str(a), str(b), "--json", *verbose],
            )
        )
    rows: dict[str, list[tuple[float, float, float, int, int]]] = {name: [] for name, _ in ways}
    notes: dict[str, str] = {}
    limited: dict[str, list[tuple[bool, int]]] = {name: [] for name, _ in ways}  # completed?, the group's peak
    for round_index in range(args.rounds):
        turn = round_index % len(ways)
        for name, command in ways[turn:] + ways[:turn]:
            for data in work.glob("data-*"):
                shutil.rmtree(data, ignore_errors=True)
            drop_caches()
            figures, errors = work / "io.txt", work / "stderr.txt"
            with memory_group(args.cgroup_memory) as group:
                inside = command if group is None else [*group.enter, *command]
                wall, rss, seconds, _ = run_child_allowing(
                    [str(PYTHON), str(wrapper), str(figures), str(errors), *inside], env, killed_ok=group is not None
                )
                if group is not None:
                    limited[name].append((group.completed(figures), group.peak()))
            read, written = (int(n) for n in figures.read_text().split()[:2])
            figures.unlink()
            rows[name].append((wall, seconds, rss, read, written))
            said = [line for line in errors.read_text(errors="replace").splitlines() if line.startswith("read once:")]
            if said:
                notes[name] = said[-1]
    print(f"{os.getloadavg()[0]:.1f} load average (1 minute) at the end; inputs {inputs / 1e9:.2f} GB")
    print(
        f"{'cold page cache':16} {'median s':>9} {'x script':>9} {'CPU s':>7} {'peak RSS MB':>12} "
        f"{'read GB':>8} {'x inputs':>9} {'written GB':>11}"
    )
    script_median = statistics.median(r[0] for r in rows["plain script"])
    for name, values in rows.items():
        wall = statistics.median(r[0] for r in values)
        read_median = float(statistics.median(r[3] for r in values))
        print(
            f"{name:16} {wall:9.2f} {wall / script_median:9.2f} {statistics.median(r[1] for r in values):7.2f} "
            f"{max(r[2] for r in values):12.0f} {read_median / 1e9:8.2f} {read_median / inputs:9.2f} "
            f"{statistics.median(r[4] for r in values) / 1e9:11.2f}"
        )
    for name, line in notes.items():
        print(f"{name}: {line}")
    if args.cgroup_memory is not None:
        print(f"in a memory cgroup of {args.cgroup_memory / 2**30:.2f} GiB (the group's peak counts page cache too):")
        for name, runs in limited.items():
            done = sum(ok for ok, _ in runs)
            print(
                f"{name:16} completed {done} of {len(runs)}; the group's peak "
                + ", ".join(f"{peak / 2**20:.0f} MiB" for _, peak in runs)
            )


WATCHED = ("sqlalchemy", "numpy", "torch", "zarr", "tensor_debugger.services", "tensor_debugger.compare")


def import_times(command: list[str], data: Path, a: Path, b: Path, env: dict[str, str]) -> dict[str, float]:
    """Seconds `compare A B --json` spends importing (`python -X importtime`): all its imports, and each of
    WATCHED's (0 where not imported)."""
    python = [str(PYTHON), "-X", "importtime"]
    if command == [str(CLI)]:
        prefix = [*python, "-m", "tensor_debugger"]
    else:  # /usr/bin/env VAR=VALUE... PYTHON -m tensor_debugger
        at = command.index(str(PYTHON))
        prefix = [*command[:at], *python, *command[at + 1 :]]
    done = subprocess.run(
        [*prefix, "--data-dir", str(data), "compare", str(a), str(b), "--json"], env=env, capture_output=True, text=True
    )
    if done.returncode not in (0, 1):
        sys.exit(f"-X importtime: exit {done.returncode}: {done.stderr[-2000:]}")
    total = 0.0
    cumulatives, selves = dict.fromkeys(WATCHED, 0.0), dict.fromkeys(WATCHED, 0.0)
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # a top-level import: the cumulative times of these add up to all
            total += int(cumulative) / 1e6
        module = name.strip()
        for watched in WATCHED:
            if module == watched:
                cumulatives[watched] = max(cumulatives[watched], int(cumulative) / 1e6)
            if module == watched or module.startswith(watched + "."):
                selves[watched] += int(own) / 1e6
    # a package's line covers what it imports, unless its modules were imported one by one after it (the parent
    # package first, on a line of its own): then the sum of its modules' own times
    return {"total": total, **{w: max(cumulatives[w], selves[w]) for w in WATCHED}}


@contextmanager
def serving(data: Path, env: dict[str, str]) -> Iterator[str]:
    """`tensor-debugger serve` on `data` and a free loopback port, answering before this yields its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    url = f"http://127.0.0.1:{port}"
    args = [str(CLI), "--data-dir", str(data), "serve", "--port", str(port), "--no-demo"]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(url + "/api/sessions", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the server on {url} did not start")
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


@contextmanager
def nothing() -> Iterator[None]:
    yield None


def run_child_allowing(cmd: list[str], env: dict[str, str], killed_ok: bool = False) -> tuple[float, float, float, str]:
    """`compare` exits 1 when a pair fails, as it must here: run it through a shell that turns 1 into 0. With
    `killed_ok` (in a memory cgroup), any exit is taken: `MemoryGroup.completed` says which ended."""
    quoted = " ".join(f"'{part}'" for part in cmd)
    check = "exit 0" if killed_ok else "[ $code -le 1 ] || exit $code"
    return run_child_cpu(["/bin/sh", "-c", f"{quoted}; code=$?; {check}"], env)


def variant(text: str) -> tuple[str, list[str]]:
    """ "direct:A=0,B=1" -> ("direct", ["A=0", "B=1"]): a `--variant`'s label and its environment's additions."""
    label, _, assignments = text.partition(":")
    pairs = [a for a in assignments.split(",") if a]
    if not label or not pairs or any("=" not in a or a.startswith("=") for a in pairs):
        raise argparse.ArgumentTypeError(f"expected LABEL:VAR=VALUE[,VAR=VALUE...], got {text!r}")
    return label, pairs


def memory_size(text: str) -> int:
    """ "1G", "512M", "2147483648" -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        return int(text[:-1]) * units[text[-1].upper()] if text[-1:].upper() in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 1G or 512M, got {text!r}") from None


class MemoryGroup:
    """A memory cgroup made for one command: `enter` is the command line prefix that moves it there (its children
    follow); `peak` the group's peak charge in bytes (its processes' memory and the page cache they filled)."""

    def __init__(self, path: Path, v2: bool) -> None:
        self.path, self.v2 = path, v2
        self.enter = ["/bin/sh", "-c", f'echo $$ > {path / "cgroup.procs"} && exec "$@"', "sh"]

    def peak(self) -> int:
        return int((self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")).read_text())

    def completed(self, figures: Path) -> bool:
        """Whether the command ended on its own: it exited 0 or 1 (the io wrapper's figures say) and the group saw
        no OOM kill."""
        if self.v2:
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            killed = int(events.get("oom_kill", 0)) > 0
        else:
            control = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
            killed = int(control.get("oom_kill", 0)) > 0
        return int(figures.read_text().split()[2]) in (0, 1) and not killed


@contextmanager
def memory_group(limit: int | None) -> Iterator[MemoryGroup | None]:
    """A new memory cgroup of `limit` bytes under this process's own (none without `limit`), removed after."""
    if limit is None:
        yield None
        return
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((line.split(":", 2)[2] for line in lines if line.split(":", 2)[1] == "memory"), None)
    if v1 is not None:
        parent, v2 = Path("/sys/fs/cgroup/memory") / v1.lstrip("/"), False
    else:
        unified = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        root = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified").is_dir() else Path("/sys/fs/cgroup")
        parent, v2 = root / unified.lstrip("/"), True
    path = parent / f"first-answer-{os.getpid()}"
    path.mkdir()
    try:
        (path / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        yield MemoryGroup(path, v2)
    finally:
        for _ in range(50):  # the killed or ended processes leave it in a moment
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


if __name__ == "__main__":
    main()
