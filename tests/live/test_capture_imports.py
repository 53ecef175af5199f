"""A plain torch model's first capture (no torch.compile anywhere in the process) imports no torch._dynamo: the
hooks were each wrapped in `torch.compiler.disable`, which imports it (about 1.5 s of CPU, most of a first capture's
cost). Where torch.compile was used, the hooks are still kept from its tracing (tests/live/test_compile_capture.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.servers import child_env

CHILD = """
import json, sys, torch
from tensor_debugger import capture
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
with torch.no_grad(), capture(model, "s", "r", data_dir=sys.argv[1], level=sys.argv[2], backward=False) as result:
    model(torch.randn(2, 8))
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "tensors": result.tensors}))
"""


def test_a_plain_models_first_capture_imports_no_dynamo(tmp_path: Path) -> None:
    for level in ("module", "op"):
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path / level), level],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["tensors"] > 0
        assert out["dynamo"] is False, level
