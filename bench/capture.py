"""Benchmark `capture()`: a Llama-shaped stack's activations recorded into a run, against its forward pass alone.

    python bench/capture.py                                 # CPU: 8 layers, hidden 2048, 512 tokens, bfloat16
    python bench/capture.py --device cuda --tokens 2048     # the issue's figure: 2,048 tokens on a GPU
    python bench/capture.py --dtype float32 --runs 3
    python bench/capture.py --gpt2                          # summaries: GPT-2 small, op capture, find_divergence
    python bench/capture.py --gpt2 --device cuda            # the same on a GPU

Each layer is RMS norm, attention (q, k, v, o projections and SDPA), RMS norm and a gated MLP (gate, up, SiLU,
down), with no embedding or head: the model's input is a (1, tokens, hidden) tensor. Every module's inputs and
outputs are captured, as `capture()` does by default. "Capture" is the wall time of the whole `with capture(...)`
block (the forward pass inside it, the writes, and the run's rows committed) into a new data dir; "activations"
is the bytes of every tensor captured, so GB/s is activations / capture time. Peak RSS is this process's high-water
mark during the captures (reset before them through /proc/self/clear_refs), and the resident size before them
(model weights, input) beside it. CPU time (this process's, all threads) says what a run costs on a busy machine,
where wall times vary with what else runs. Nothing here asserts on timings; the numbers are for reading.

`--gpt2` measures summaries instead, on a GPT-2-small-sized model built by transformers from a `GPT2Config` (12
layers, hidden 768, 12 heads, random weights, seeded; nothing downloaded) over 256 tokens on the CPU (`--device cuda`:
on the GPU, each wall time ending when the GPU's queued work has): an op capture
with `values="summary"` against the plain forward pass (into a new data dir, whose database is made first, and
again into that data dir, now in use, as another session), its data (what the data dir grows by) against an op capture
with `values="full"`, and `find_divergence` (a planted change in layer 6's attention output projection) against two
plain forward passes. Beside the wall times, each one's CPU time (this process, all threads), which a busy machine
disturbs less. The process's first summary capture (what it imports and loads once) runs before those measured, and
is printed on its own line.

`PYTHONPATH=/path/to/other/server` measures another checkout's `tensor_debugger` with the same model.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import machine_line

MB, GB = 1e6, 1e9


def rss_mb(field: str) -> float:
    """VmRSS or VmHWM of this process, in MB."""
    with open("/proc/self/status", encoding="utf-8") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith(f"{field}:"))
    return kib * 1024 / MB


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux 4.0 and later)
        return True
    except OSError:
        return False


def build_model(layers: int, hidden: int, intermediate: int, heads: int, dtype_name: str, device: str) -> object:
    import torch
    from torch import nn
    from torch.nn import functional

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(hidden, hidden, bias=False) for _ in range(4)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
            y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out: torch.Tensor = self.o_proj(y.transpose(1, 2).reshape(b, t, hidden))
            return out

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
            self.up_proj = nn.Linear(hidden, intermediate, bias=False)
            self.down_proj = nn.Linear(intermediate, hidden, bias=False)
            self.act_fn = nn.SiLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
            return out

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = nn.RMSNorm(hidden)
            self.self_attn = Attention()
            self.post_attention_layernorm = nn.RMSNorm(hidden)
            self.mlp = Mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.self_attn(self.input_layernorm(x))
            out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
            return out

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    with torch.device(device):
        model = Stack()
    for p in model.parameters():
        p.data.mul_(0.5)  # keeps activations finite over the layers without a real model's trained scales
    return model.to(getattr(torch, dtype_name)).eval()


def dir_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def gpt2_summaries(runs: int, workdir: Path | None, device: str) -> None:
    """The `--gpt2` figures (see the module docstring), the models and input on `device`."""
    import tensor_debugger
    import torch
    from tensor_debugger import capture, find_divergence
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from transformers import GPT2Config, GPT2LMHeadModel

    def build(planted: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        # typed in some transformers releases, not in others
        make_config: Callable[..., Any] = GPT2Config
        make_model: Callable[..., torch.nn.Module] = GPT2LMHeadModel
        config = make_config(n_layer=12, n_embd=768, n_head=12, n_positions=256, vocab_size=50257)
        model = make_model(config)
        model.to(device).eval()
        if planted:
            with torch.no_grad():
                model.get_parameter("transformer.h.6.attn.c_proj.weight").mul_(1.01)
        return model

    reference, candidate = build(False), build(True)
    ids = torch.randint(0, 50257, (1, 256), generator=torch.Generator().manual_seed(1)).to(device)

    def synchronize() -> None:
        """Wait for the device's queued work, so a wall time covers it (a no-op on the CPU)."""
        if ids.is_cuda:
            torch.cuda.synchronize()

    cpu: dict[str, list[float]] = {"forward": [], "summary": [], "full": [], "find": [], "again": []}

    def forward(model: torch.nn.Module) -> float:
        start, start_cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            model(input_ids=ids)
        synchronize()
        cpu["forward"].append(time.process_time() - start_cpu)
        return time.perf_counter() - start

    forward(reference)
    cpu["forward"].clear()
    forward_s = statistics.median(forward(reference) for _ in range(3))
    work = Path(tempfile.mkdtemp(prefix="bench-summary-", dir=workdir))
    try:
        empty = work / "empty"
        open_services(Settings.from_environ(data_dir=empty)).close()
        base = dir_bytes(empty)
        # the process's first capture (imports what a capture uses beyond opening a data dir, the summary kernel's
        # library, torch's function-mode machinery), measured apart as the forward's warm-up is: in the medians
        # below it was one of the new data dir's runs, which then stood for the highest of the other two
        start, start_cpu = time.perf_counter(), time.process_time()
        with torch.no_grad(), capture(reference, "bench", "r", data_dir=work / "first", level="op", values="summary"):
            reference(input_ids=ids)
        synchronize()
        first_s, first_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        shutil.rmtree(work / "first", ignore_errors=True)
        timings: dict[str, list[float]] = {"summary": [], "full": [], "again": []}
        sizes: dict[str, int] = {}
        tensors: dict[str, int] = {}
        for values in ("summary", "full"):
            for run in range(runs):
                data = work / f"{values}-{run}"
                start, start_cpu = time.perf_counter(), time.process_time()
                with (
                    torch.no_grad(),
                    capture(reference, "bench", "r", data_dir=data, level="op", values=values) as result,
                ):
                    reference(input_ids=ids)
                synchronize()
                timings[values].append(time.perf_counter() - start)
                cpu[values].append(time.process_time() - start_cpu)
                sizes[values] = dir_bytes(data) - base
                tensors[values] = result.tensors
                if values == "summary":  # the same capture again, into the data dir now in use (another session)
                    start, start_cpu = time.perf_counter(), time.process_time()
                    with (
                        torch.no_grad(),
                        capture(reference, "bench again", "r", data_dir=data, level="op", values=values),
                    ):
                        reference(input_ids=ids)
                    synchronize()
                    timings["again"].append(time.perf_counter() - start)
                    cpu["again"].append(time.process_time() - start_cpu)
                shutil.rmtree(data, ignore_errors=True)
                print(f"{values} run {run}: {timings[values][-1]:.2f} s", file=sys.stderr)
        found_s: list[float] = []
        found = None
        for run in range(runs):
            start, start_cpu = time.perf_counter(), time.process_time()
            found = find_divergence(
                reference, candidate, {"input_ids": ids}, session="bench", data_dir=work / f"f{run}"
            )
            synchronize()
            found_s.append(time.perf_counter() - start)
            cpu["find"].append(time.process_time() - start_cpu)
            print(f"find_divergence run {run}: {found_s[-1]:.2f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary_s, full_s, again_s, find_s = (
        statistics.median(t) for t in (timings["summary"], timings["full"], timings["again"], found_s)
    )
    print(machine_line(f"torch {torch.__version__}"))
    print(f"tensor_debugger from {Path(tensor_debugger.__file__).parent.parent}")
    where = torch.cuda.get_device_name(ids.device) if ids.is_cuda else "CPU"
    print(f"model: GPT-2 small shape (12 layers, hidden 768, 12 heads), random weights, 256 tokens, float32, {where}")
    print(f"{'':34}{'time':>10}{'x forward':>11}{'data':>12}{'tensors':>9}")
    print(f"{'plain forward':34}{forward_s:>8.3f} s{1:>11.2f}{'':>12}{'':>9}")
    for label, seconds, values in (
        ("op capture, values=summary", summary_s, "summary"),
        ("op capture, values=full", full_s, "full"),
    ):
        print(
            f"{label:34}{seconds:>8.3f} s{seconds / forward_s:>11.2f}{sizes[values] / MB:>9.2f} MB{tensors[values]:>9}"
        )
    print(
        f"summary data / full data: {100 * sizes['summary'] / sizes['full']:.3f}% (goal <= 1%); summary capture / "
        f"forward: {summary_s / forward_s:.2f}x (goal <= 1.5x) into a new data dir, {again_s / forward_s:.2f}x "
        f"({again_s:.3f} s) into one in use"
    )
    print(
        f"the process's first summary capture (before those above, into a new data dir): {first_s:.3f} s = "
        f"{first_s / forward_s:.2f}x the forward, {first_cpu:.2f} s CPU"
    )
    print(
        f"find_divergence: {find_s:.3f} s = {find_s / (2 * forward_s):.2f}x two plain forwards ({2 * forward_s:.3f} s; "
        f"goal < 3x); found {found.first.reference if found and found.first else None}"
    )
    forward_cpu, summary_cpu, full_cpu, find_cpu, again_cpu = (statistics.median(cpu[k]) for k in cpu)
    print(
        f"CPU time (this process, all threads; medians): forward {forward_cpu:.2f} s, summary capture "
        f"{summary_cpu:.2f} s ({summary_cpu / forward_cpu:.2f}x; into a data dir in use {again_cpu:.2f} s, "
        f"{again_cpu / forward_cpu:.2f}x), full capture {full_cpu:.2f} s "
        f"({full_cpu / forward_cpu:.2f}x), find_divergence {find_cpu:.2f} s ({find_cpu / (2 * forward_cpu):.2f}x two "
        "forwards)"
    )
    print(f"runs: {runs} of each, medians; load average when done: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632, help="MLP width (default 5632, Llama's 2.75x)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512, help="sequence length (the issue's figure: 2048)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--runs", type=int, default=2, help="captures measured, each a new run (default 2)")
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the data dir (default: the temp dir)")
    parser.add_argument(
        "--host-memory-mib",
        type=int,
        default=None,
        help="capture()'s host buffer budget, when the capture() measured takes one",
    )
    parser.add_argument("--gpt2", action="store_true", help="summaries on a GPT-2-small-sized model (see above)")
    args = parser.parse_args()
    if args.gpt2:
        gpt2_summaries(args.runs, args.workdir, args.device)
        return

    import tensor_debugger
    import torch
    from tensor_debugger import capture

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    model = build_model(args.layers, args.hidden, args.intermediate, args.heads, args.dtype, args.device)
    x = torch.randn(1, args.tokens, args.hidden, generator=torch.Generator().manual_seed(1)).to(
        device=device, dtype=getattr(torch, args.dtype)
    )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def forward() -> float:
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            model(x)  # type: ignore[operator]
        sync()
        return time.perf_counter() - start

    forward()  # warm-up: kernels chosen, memory allocated
    forward_s = statistics.median(forward() for _ in range(3))

    activations = 0
    count = 0

    def tally(_: object, args_: tuple[object, ...], out: object) -> None:
        nonlocal activations, count
        for value in (*args_, out):
            if isinstance(value, torch.Tensor):
                activations += value.numel() * value.element_size()
                count += 1

    handles = [m.register_forward_hook(tally) for m in model.modules()]  # type: ignore[attr-defined]
    with torch.no_grad():
        model(x)  # type: ignore[operator]
    for handle in handles:
        handle.remove()

    options = {} if args.host_memory_mib is None else {"host_memory": args.host_memory_mib << 20}
    work = Path(tempfile.mkdtemp(prefix="bench-capture-", dir=args.workdir))
    times: list[float] = []
    cpu: list[float] = []
    try:
        base_rss = rss_mb("VmRSS")
        peak_known = reset_peak_rss()
        for run in range(args.runs):
            sync()
            start, start_cpu = time.perf_counter(), sum(os.times()[:2])
            with (
                torch.no_grad(),
                capture(model, session="bench", run=f"run {run}", data_dir=work / "data", **options) as result,
            ):
                model(x)  # type: ignore[operator]
            times.append(time.perf_counter() - start)
            cpu.append(sum(os.times()[:2]) - start_cpu)
            print(f"run {run}: {times[-1]:.2f} s, {result.tensors} tensors", file=sys.stderr)
        peak = rss_mb("VmHWM")
        stored = sum(p.stat().st_size for p in (work / "data").rglob("*") if p.is_file())
    finally:
        shutil.rmtree(work, ignore_errors=True)

    capture_s = statistics.median(times)
    gpu = f", {torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
    print(machine_line(f"torch {torch.__version__}{gpu}"))
    print(f"tensor_debugger from {Path(tensor_debugger.__file__).parent.parent}")
    print(
        f"model: {args.layers} layers, hidden {args.hidden}, MLP {args.intermediate}, {args.tokens} tokens, "
        f"{args.dtype} on {args.device}"
    )
    print(
        f"activations per run: {count} tensors, {activations / MB:.0f} MB (stored, all runs, compressed: "
        f"{stored / MB:.0f} MB)"
    )
    print(f"forward pass alone: {forward_s:.3f} s (median of 3)")
    print(
        f"capture per run: {capture_s:.2f} s (median of {args.runs}: {', '.join(f'{t:.2f}' for t in times)} s), "
        f"{activations / capture_s / GB:.3f} GB/s of activations; CPU time (user + system, all threads) "
        f"{statistics.median(cpu):.2f} s per run"
    )
    print(f"load average when done: {os.getloadavg()[0]:.1f} (other processes share these cores when above 0)")
    if peak_known:
        print(
            f"peak RSS during captures: {peak:.0f} MB (resident before them: {base_rss:.0f} MB; "
            f"+{peak - base_rss:.0f} MB)"
        )


if __name__ == "__main__":
    main()
