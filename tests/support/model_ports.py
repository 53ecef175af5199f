"""Ports of transformers models for tests: a model family's own `modeling_<family>.py` copied with one line changed,
written to a folder and imported as a module of its own, so that a test compares the model against a port whose bug
(and its line) it knows."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from tests.support.source_lines import line_holding


@dataclass(frozen=True)
class Port:
    """The original modeling file, its port's path and the port's module."""

    original: Path
    path: Path
    module: ModuleType

    def lines(self, needle: str, port_needle: str | None = None) -> tuple[str, str]:
        """`path:line` of the one line holding `needle` in the original, and `port_needle` (or `needle`) in the port."""
        return line_holding(self.original, needle), line_holding(self.path, port_needle or needle)


def config_of(name: str, **kwargs: Any) -> Any:
    """The transformers config class `name` made with `kwargs`; the test skips, naming the release, where the
    installed transformers has no such class."""
    import transformers

    if not hasattr(transformers, name):
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    return getattr(transformers, name)(**kwargs)


@contextmanager
def port_writer(folder: Path) -> Iterator[Callable[[str, str, str, str], Port]]:
    """`write(family, stem, old, new)`: `modeling_<family>.py` of the installed transformers with `old` (which must
    appear once, else the test is skipped naming the release) replaced by `new`, written as `<stem>.py` in `folder`
    and imported as module `stem`; the modules made are removed from `sys.modules` on the way out."""
    transformers = pytest.importorskip("transformers")
    made: list[str] = []

    def write(family: str, stem: str, old: str, new: str) -> Port:
        original = Path(transformers.__file__).parent / "models" / family / f"modeling_{family}.py"
        if not original.is_file():  # a family newer than this release
            pytest.skip(f"transformers {transformers.__version__} has no modeling_{family}.py")
        text = original.read_text(encoding="utf-8")
        if text.count(old) != 1:  # the case's port is written against a newer release's source
            pytest.skip(f"transformers {transformers.__version__}'s modeling_{family}.py has no single {old!r}")
        text = text.replace(old, new)
        text = re.sub(r"from \.\.\.(\w)", r"from transformers.\1", text).replace(
            "from ... import", "from transformers import"
        )
        text = re.sub(r"from \.\.(\w)", r"from transformers.models.\1", text)
        text = re.sub(r"from \.(\w)", rf"from transformers.models.{family}.\1", text)
        path = folder / f"{stem}.py"
        path.write_text(text, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[stem] = module
        made.append(stem)
        spec.loader.exec_module(module)
        return Port(original, path, module)

    try:
        yield write
    finally:
        for name in made:
            sys.modules.pop(name, None)


def jittered_pair(port: Port, cls: str, config: Any) -> tuple[nn.Module, nn.Module]:
    """The transformers class `cls` built from `config` with its weights jittered (norms' ones and zeros would hide a
    swapped norm), and the port's class with the same weights; eager attention and experts (the code a port
    changes, not a fused kernel), eval mode."""
    import transformers

    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    reference: nn.Module = getattr(transformers, cls)(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    candidate: nn.Module = getattr(port.module, cls)(config).eval()
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate
