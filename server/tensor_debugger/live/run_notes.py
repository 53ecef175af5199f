"""What a recording says on its run as it ends: what the capture could not see, or was not asked for."""

from __future__ import annotations

from tensor_debugger.live.call_recorder import Recorder
from tensor_debugger.live.capture_types import Level


def _note_recomputed(recorder: Recorder) -> None:
    """Say on the run which recorded modules were run again by a backward pass, and what of them was recorded."""
    if not recorder.recomputed:
        return
    calls = sum(recorder.recomputed.values())
    named = ", ".join(recorder.recomputed)
    recorder.notes.append(
        f"{calls} call{'s' if calls != 1 else ''} of {named} (with the modules inside) ran again during the "
        "backward pass (activation checkpointing's recomputation): not recorded as calls of their own, their "
        "tensors are those of the forward's calls; the values recomputed were not recorded, so they were not "
        "compared with the forward's"
    )


def _note_unseen_grads(recorder: Recorder) -> None:
    """Say on the run which recorded modules' gradients torch's full backward hooks could not see."""
    for path, kind in recorder.unseen_grads.items():
        recorder.notes.append(
            f"{path} returned a {kind}, not a tensor or a tuple of tensors: torch's module backward hooks cannot "
            f"see its gradients, so {path}/grad_output and {path}/grad_input were not recorded (the gradients of "
            "its parameters and of the modules inside it were)"
        )


def _note_compiled(recorder: Recorder) -> None:
    """Say on the run which modules ran compiled, whose ops op capture does not record."""
    for path in recorder.compiled_calls:
        recorder.notes.append(
            f"{path} ran compiled (torch.compile): its ops are not visible to op capture "
            "(its modules' inputs and outputs are recorded; capture the model uncompiled to see its ops)"
        )


def end_recording(recorder: Recorder, level: Level) -> None:
    """The block of a capture (or `record`) ended without raising: its summaries all in, its notes said."""
    if recorder.root is None:
        raise RuntimeError(f"capture of {recorder.root_name}: the model was not called inside the block")
    if level == "op":
        _note_compiled(recorder)
    _note_recomputed(recorder)
    if recorder.grads:
        _note_unseen_grads(recorder)
    recorder.settle()
    asked = f"modules {', '.join(recorder.patterns)}" if recorder.patterns else "every module"
    if recorder.halted:
        recorder.notes.append(
            f"recorded {asked} only, up to {recorder.last}, the last tensor of theirs: the forward was stopped "
            "after it, so nothing after it (the model's outputs among them) was recorded"
        )
    elif recorder.left_out:
        many = recorder.left_out != 1
        recorder.notes.append(
            f"recorded {asked} only, up to {recorder.last}, the last tensor of theirs: "
            f"{recorder.left_out} tensor{'s' if many else ''} after it (the model's outputs among them) "
            f"{'were' if many else 'was'} not recorded"
        )
