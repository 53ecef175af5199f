"""Ingest the files of one upload request: each form field is a run, labelled by the field's name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensor_debugger.errors import FileProblem, NothingUsableError
from tensor_debugger.inputs import InputFile
from tensor_debugger.schemas import problem_json
from tensor_debugger.services import Services
from tensor_debugger.upload import UploadBatch


@dataclass
class RunOutcome:
    label: str
    run_id: int | None  # None: nothing usable was found, and no run was kept
    tensors: int = 0
    problems: list[FileProblem] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "run_id": self.run_id,
            "tensors": self.tensors,
            "problems": [problem_json(p) for p in self.problems],
        }


def group_by_run(batch: UploadBatch, default_label: str | None = None) -> dict[str, list[InputFile]]:
    """Files grouped by form field, in the order the fields first appear; `default_label` overrides them."""
    runs: dict[str, list[InputFile]] = {}
    for upload in batch.files:
        label = default_label or upload.field or "run"
        runs.setdefault(label, []).append(InputFile(upload.path, upload.filename))
    return runs


def ingest_batch(services: Services, session_name: str, runs: dict[str, list[InputFile]]) -> list[RunOutcome]:
    outcomes: list[RunOutcome] = []
    for label, inputs in runs.items():
        try:
            result = services.ingestor.ingest(session_name, label, inputs, create_session=False)
        except NothingUsableError as exc:
            outcomes.append(RunOutcome(label, None, 0, exc.problems))
        else:
            outcomes.append(RunOutcome(label, result.run_id, result.tensors, result.problems))
            services.plan(result.session_id)
    return outcomes
