"""Start-up cost of the CLI: what a command imports. torch alone takes about a second to import, so a command that
does not read a PyTorch file must not import it; Alembic (a quarter of a second) only runs on a database that is not
at the newest migration and not new; Zarr only where a local folder's arrays are not written by the chunk writer."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from litestar.testing import TestClient
from safetensors.torch import save_file
from tensor_debugger.settings import Settings
from tensor_debugger.web.app import create_app

# Runs the CLI in this interpreter's child, then reports the top-level packages it imported on stderr's last line.
_PROBE = """
import json, sys
from tensor_debugger.cli.main import main
try:
    code = main(sys.argv[1:])
finally:  # --help exits from inside main
    print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)
raise SystemExit(code)
"""


def imported_by(*args: str) -> tuple[set[str], str]:
    """The top-level packages `tensor-debugger ARGS` imported, and what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stderr.strip().splitlines()[-1])), done.stdout


def ingest(data: Path, run: str, path: Path) -> set[str]:
    modules, out = imported_by("--data-dir", str(data), "ingest", "--session", "s", "--run", run, str(path), "--json")
    assert json.loads(out)["run"]["tensors"] == 1
    return modules


def test_npy_safetensors_and_pth_ingest_without_torch(tmp_path: Path) -> None:
    npy = tmp_path / "a.npy"
    np.save(npy, np.arange(4, dtype=np.float32))
    bf16 = tmp_path / "b.safetensors"
    save_file({"w": torch.arange(8, dtype=torch.bfloat16)}, str(bf16))
    data = tmp_path / "data"
    first = ingest(data, "npy", npy)  # a new data folder: created from the models and stamped, without Alembic
    assert not first & {"torch", "alembic", "zarr"}
    second = ingest(data, "safetensors", bf16)  # an existing one, already at the newest migration
    assert not second & {"torch", "alembic", "mako", "pygments"}
    pth = tmp_path / "c.pth"
    torch.save(torch.arange(3), pth)
    assert "torch" not in ingest(data, "pth", pth)  # PyTorch's zip format is read without torch
    legacy = tmp_path / "d.pth"
    torch.save(torch.arange(3), legacy, _use_new_zipfile_serialization=False)
    assert "torch" in ingest(data, "legacy", legacy)  # the pre-1.6 format is left to torch.load


def test_help_and_sessions_import_only_what_they_use(tmp_path: Path) -> None:
    modules, out = imported_by("--help")
    assert "TENSOR_DEBUGGER_DATA_DIR" in out
    assert not modules & {"torch", "numpy", "sqlalchemy", "zarr", "litestar", "alembic", "jinja2"}
    modules, out = imported_by("--data-dir", str(tmp_path / "data"), "sessions", "--json")
    assert json.loads(out) == []
    assert not modules & {"torch", "litestar", "jinja2", "uvicorn"}


@pytest.mark.parametrize("demo", [False, True], ids=["without-the-demo", "restart-with-the-demo"])
def test_a_server_starts_without_torch(tmp_path: Path, demo: bool) -> None:
    """Every test server, and a user's with --no-demo, starts without torch's second (the demo's generator uses it);
    so does a user's server restarted on a data dir whose demo session was made (`make run`, the second time)."""
    data = tmp_path / "data"
    if demo:  # the first start, here: it writes the demo's dumps with torch
        with TestClient(create_app(Settings(data_dir=data, demo=True)), base_url="http://127.0.0.1") as client:
            assert "demo: planted divergence" in client.get("/").text
    probe = (
        "import pathlib, sys;"
        "from litestar.testing import TestClient;"
        "from tensor_debugger.settings import Settings;"
        "from tensor_debugger.web.app import create_app;"
        f"s = Settings(data_dir=pathlib.Path({str(data)!r}), demo={demo});"
        "c = TestClient(create_app(s), base_url='http://127.0.0.1').__enter__();"
        "page = c.get('/'); assert page.status_code == 200;"
        "print('torch' in sys.modules, 'demo: planted divergence' in page.text)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"False {demo}"


def opened_data_dir(root: Path) -> Path:
    """A data dir with its database and store made: `sessions` on a new one opens nothing (it creates nothing), and
    these tests are about a command's start-up as it opens them."""
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    data = root / "data"
    open_services(Settings(data_dir=data, demo=False)).close()
    return data


def test_collector_back_on_after_start_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensor_debugger.cli.main import main

    data = opened_data_dir(tmp_path)
    try:
        assert main(["--data-dir", str(data), "sessions", "--json"]) == 0
        assert gc.isenabled() and gc.get_freeze_count() > 0  # what start-up built is frozen, collection is on
    finally:
        gc.unfreeze()
    assert json.loads(capsys.readouterr().out) == []


def test_compare_again_on_unchanged_files_imports_neither_zarr_nor_torch(tmp_path: Path) -> None:
    """A re-run reuses both runs' stored tensors and every stored result: Zarr and numcodecs (0.17 s) stay out."""
    for run, shift in (("a", 0.0), ("b", 1.0)):
        (tmp_path / run).mkdir()
        for name in ("0_x", "1_x"):
            np.save(tmp_path / run / f"{name}.npy", np.arange(4, dtype=np.float32) + (shift if name == "1_x" else 0))
    args = ("--data-dir", str(tmp_path / "data"), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    first = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 1, first.stderr  # a divergence found
    # the first compare stores the tensors, writing their arrays' metadata itself
    assert not {"zarr", "alembic"} & set(json.loads(first.stderr.strip().splitlines()[-1]))
    again = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 1, again.stderr
    modules = set(json.loads(again.stderr.strip().splitlines()[-1]))
    assert not modules & {"zarr", "numcodecs", "torch", "alembic", "litestar", "jinja2"}
    assert json.loads(again.stdout)["first_divergence"] == json.loads(first.stdout)["first_divergence"]


def test_a_first_compare_imports_no_ingest_children(tmp_path: Path) -> None:
    """`compare` ingests both runs in threads of its own process: the server's ingest queue and its child processes
    (ingest/queue.py, ingest/child.py, concurrent.futures' process pools) are not imported, as a server's uploads
    are. The answer is the same as ever."""
    for run, shift in (("a", 0.0), ("b", 1.0)):
        (tmp_path / run).mkdir()
        for name in ("0_x", "1_x"):
            np.save(tmp_path / run / f"{name}.npy", np.arange(4, dtype=np.float32) + (shift if name == "1_x" else 0))
    probe = _PROBE.replace("{m.split('.')[0] for m in sys.modules}", "set(sys.modules)")
    args = ("--data-dir", str(tmp_path / "data"), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stderr  # a divergence found
    modules = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "tensor_debugger.compare.pipeline" in modules  # the probe lists modules, not packages
    assert not modules & {"tensor_debugger.ingest.queue", "tensor_debugger.ingest.child", "concurrent.futures.process"}
    answer = json.loads(done.stdout)
    assert answer["first_divergence"]["name"] == "1_x"
    assert [p["status"] for p in answer["pairs"]] == ["pass", "fail"]


def test_start_up_leaves_planning_and_reports_to_the_ingest(tmp_path: Path) -> None:
    """What `compare` imports and opens before its runs' first byte is read leaves out the planning, the reports
    and the server's session actions (the pipeline imports the first two while the runs ingest); a server's
    `Services.actions` and `Services.ingests` are made, and imported, on first use."""
    probe = (
        "import sys, pathlib;"
        "import tensor_debugger.cli.main, tensor_debugger.cli.compare;"
        "from tensor_debugger.services import open_services;"
        "from tensor_debugger.settings import Settings;"
        f"services = open_services(Settings(data_dir=pathlib.Path({str(tmp_path / 'data')!r}), demo=False));"
        "late = ('tensor_debugger.compare.planning.plan', 'tensor_debugger.compare.reports.pair_reports',"
        " 'tensor_debugger.compare.actions', 'tensor_debugger.ingest.queue');"
        "print([m for m in late if m in sys.modules]);"
        "services.actions.plan, services.ingests.submit;"
        "print([m for m in late if m not in sys.modules]);"
        "services.close()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "[]"]


@pytest.mark.parametrize(("preset", "threads"), [(None, 1), ("2", 2)])
def test_numpy_starts_no_blas_thread_unless_asked(tmp_path: Path, preset: str | None, threads: int) -> None:
    """OpenBLAS starts a spinning thread per core when numpy is imported, for BLAS calls nothing here makes: the
    command asks for none (a user's OPENBLAS_NUM_THREADS is kept), so after `sessions` the process has one thread."""
    probe = (
        "import os, sys; from tensor_debugger.cli.main import main;"
        f"main(['--data-dir', {str(opened_data_dir(tmp_path))!r}, 'sessions', '--json']);"
        "assert 'numpy' in sys.modules;"
        # the threads that stay (OpenBLAS's pool stays for the process's life; a thread on its way out is not one)
        "import time; counts = [len(os.listdir('/proc/self/task')) for _ in range(10) if not time.sleep(0.05)];"
        "print(min(counts), file=sys.stderr)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TENSOR_DEBUGGER_", "OPENBLAS_"))}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stderr.strip().splitlines()[-1]) == threads
