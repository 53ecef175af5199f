"""A plain torch model's first capture (no torch.compile anywhere in the process) imports no torch._dynamo: the
hooks were each wrapped in `torch.compiler.disable`, which imports it (about 1.5 s of CPU, most of a first capture's
cost); nor the session actions (`compare/actions.py`). Where torch.compile was used, the hooks are still kept from
its tracing (tests/live/test_compile_capture.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.servers import child_env

# One new process imports torch and `capture` (what a user's script does first), then forks once for each level:
# each fork starts from those imports and nothing else, as a new process would, and makes the process's first
# capture; torch is imported once, not once a level (1.5 to 3.5 s of CPU each).
CHILD = """
import json, os, sys, traceback, torch
from tensor_debugger import capture
for level in ("module", "op"):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
            data_dir = os.path.join(sys.argv[1], level)
            with torch.no_grad(), capture(model, "s", "r", data_dir=data_dir, level=level, backward=False) as result:
                model(torch.randn(2, 8))
            print(json.dumps({
                "level": level,
                "dynamo": "torch._dynamo" in sys.modules,
                "actions": "tensor_debugger.compare.actions" in sys.modules,
                "tensors": result.tensors,
            }))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        sys.exit(f"the {level} capture's process failed: status {status}")
"""


def test_a_plain_models_first_capture_imports_no_dynamo(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    outs = [json.loads(line) for line in done.stdout.strip().splitlines() if line.startswith("{")]
    assert [out["level"] for out in outs] == ["module", "op"], done.stdout
    for out in outs:
        assert out["tensors"] > 0
        assert out["dynamo"] is False, out["level"]
        # pairing the session when the block ends needs the planning, not the users' actions and the reports they
        # import (about 0.1 s of CPU, after the forward)
        assert out["actions"] is False, out["level"]
