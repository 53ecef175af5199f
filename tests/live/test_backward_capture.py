"""`capture(backward=True)`: the gradients of the backward pass, in the order it computes them, and the first
diverging gradient of a port whose backward only is wrong."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import TensorRecord
from torch import nn

from tests.support.backward_models import DIM, Tiny
from tests.support.sessions import compared, names_and_notes


def train_step(model: nn.Module, session: str, run: str, settings: Settings) -> int:
    x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(1))
    with capture(model, session=session, run=run, data_dir=settings.data_dir, backward=True, workers=1) as result:
        model(x).pow(2).mean().backward()
    assert result.session_id is not None and result.run_id is not None
    return int(result.run_id)


def test_gradients_are_recorded_in_backward_order_and_the_first_wrong_one_is_the_modules(settings: Settings) -> None:
    model = Tiny()
    run_id = train_step(model, "grads", "reference", settings)
    train_step(Tiny(factor=1.01), "grads", "candidate", settings)
    services = open_services(settings)
    try:
        with services.sessions() as db:
            query = select(TensorRecord).where(TensorRecord.run_id == run_id).order_by(TensorRecord.position)
            rows = list(db.scalars(query))
        names = [t.name for t in rows]
        grads = [n for n in names if "/grad" in n]
        assert grads == [  # the backward's order: from the loss back to the inputs, each module's parameters
            "Tiny/grad_output_outputs",
            "Tiny.down/grad_output_outputs",
            "Tiny.down.bias/grad_outputs",
            "Tiny.down.weight/grad_outputs",
            "Tiny.down/grad_input_outputs",
            "Tiny.act/grad_output_outputs",
            "Tiny.act/grad_input_outputs",
            "Tiny.up/grad_output_outputs",
            "Tiny.up.bias/grad_outputs",
            "Tiny.up.weight/grad_outputs",
        ], grads
        assert names.index("Tiny/grad_output_outputs") > names.index("Tiny.down_outputs")  # after the forward
        by_name = {t.name: t for t in rows}
        weight = by_name["Tiny.up.weight/grad_outputs"]
        stored = services.store.open(weight.store_key, weight.digest)
        assert model.up.weight.grad is not None
        assert torch.equal(torch.from_numpy(np.array(stored[...])), model.up.weight.grad)  # the gradient itself
    finally:
        services.close()
    report = compared(settings, "grads")
    assert all(p.status == "pass" for p in report.pairs if "/grad" not in p.name)  # the forward is the same
    first = report.first_divergence
    assert first is not None and first.module_path == "Tiny.act/grad_input", first  # the wrong backward's gradient
    failing = {p.module_path for p in report.pairs if p.status == "fail"}
    assert "Tiny.act/grad_output" not in failing and "Tiny.up.weight/grad" in failing  # before: right; after: wrong


class Outputs(nn.Module):
    """`Tiny` returning a dict, as a transformers model returns a ModelOutput: torch's module backward hooks see
    only a tensor or a tuple, so the model's own gradients cannot be recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.tiny = Tiny()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.tiny(x)}


def test_a_module_returning_a_dict_says_its_gradients_were_not_recorded_and_torch_does_not_warn(
    settings: Settings,
) -> None:
    """The run's note names the module whose gradients were not recorded, and why; torch's own warnings about the
    capture's hooks (the dict output, the first module's input needing no gradient) do not reach the user."""
    model, x = Outputs(), torch.randn(4, DIM, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with capture(model, "dict out", "reference", data_dir=settings.data_dir, backward=True, workers=1):
            model(x)["out"].pow(2).mean().backward()
        warnings.warn("the user's own warning, after the block", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["the user's own warning, after the block"]
    names, notes = names_and_notes(settings, "dict out", "reference")
    grads = [n for n in names if "/grad" in n]
    assert "Outputs.tiny/grad_output_outputs" in grads and "Outputs.tiny.up.weight/grad_outputs" in grads, grads
    assert not any(n.startswith("Outputs/") for n in grads), grads
    assert notes == [
        "Outputs returned a dict, not a tensor or a tuple of tensors: torch's module backward hooks cannot see its "
        "gradients, so Outputs/grad_output and Outputs/grad_input were not recorded (the gradients of its "
        "parameters and of the modules inside it were)"
    ], notes
