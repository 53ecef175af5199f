"""The JSON `compare --json` and `ingest --json` print is the type `compare/reports/compare_report.py` declares: it
decodes into CompareReport (IngestReport) with msgspec's strict decoding, and encodes back to the very same JSON, so
no field the README documents is outside the type and none of the type's is missing from the output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import torch
from tensor_debugger.compare.reports.compare_report import CompareReport, IngestReport, to_json

from tests.support.cli_main import main_cli
from tests.support.dumps import layered_dump


def decoded(stdout: str) -> tuple[CompareReport, dict[str, Any]]:
    report = msgspec.json.decode(stdout.encode(), type=CompareReport, strict=True)
    data = json.loads(stdout)
    assert to_json(report) == data  # every field typed, none added
    assert json.dumps(to_json(report)) == stdout.strip()  # the same bytes, key order included
    return report, data


def test_compare_json_is_a_compare_report(tmp_path: Path) -> None:
    ref = layered_dump(tmp_path / "ref", None)
    cand = layered_dump(tmp_path / "cand", 2)
    (cand / "config.json").write_text('{"hidden_size": 8}')  # a file with no tensor: an ignored problem
    torch.save(torch.ones(3), ref / "9_extra.pth")  # a reference tensor with no partner
    other = layered_dump(tmp_path / "other", 1)
    data_dir = str(tmp_path / "data")
    done = main_cli("--data-dir", data_dir, "compare", str(ref), str(cand), "--json")
    assert done.returncode == 1, done.stderr
    report, data = decoded(done.stdout)
    assert report.first_divergence is not None and report.first_divergence.name == "2_attn"
    assert report.verdict == "diverged" and report.coverage is not None
    assert report.coverage.unmatched == ["9_extra"] and report.unmatched.a == ["9_extra"]
    assert [(p.file.rsplit("/", 1)[1], p.ignored) for p in report.problems] == [("config.json", True)]
    failing = report.pair_named("2_attn")
    assert failing.stats is not None and failing.stats.worst and failing.where is not None
    assert report.culprits and isinstance(report.culprits[0].name, str)  # a plain dump's stages
    assert set(data["culprits"][0]) == {"name", "layer", "stage", "previous", "added_error", "input_error",
                                         "output_error", "paired_by", "candidate_name"}  # fmt: skip
    assert "error" not in data  # only where nothing could be compared

    several = main_cli("--data-dir", data_dir, "compare", str(ref), str(cand), str(other), "--json")
    report, _ = decoded(several.stdout)
    firsts = {label: first and first.name for label, first in report.first_divergences.items()}
    assert sorted(firsts.values(), key=str) == ["1_attn", "2_attn"]
    assert {p.candidate for p in report.pairs} == set(firsts)


def test_unusable_and_ingest_json_are_typed(tmp_path: Path) -> None:
    ref = layered_dump(tmp_path / "ref", None)
    pairing = tmp_path / "pairing.json"
    pairing.write_text("[]")
    data_dir = str(tmp_path / "data")
    refused = main_cli("--data-dir", data_dir, "compare", str(ref), str(ref), "--pairing", str(pairing), "--json")
    assert refused.returncode == 2
    report, data = decoded(refused.stdout)
    assert report.error == f"pairing file {pairing}: not a JSON object" == data["error"]
    assert report.session is None and report.pairs == [] and report.verdict == "incomplete"

    ingested = main_cli("--data-dir", data_dir, "ingest", "--session", "s", "--run", "r", str(ref), "--json")
    assert ingested.returncode == 0, ingested.stderr
    run = msgspec.json.decode(ingested.stdout.encode(), type=IngestReport, strict=True)
    assert run.run is not None and run.run.tensors == 8 and run.run.label == "r"
    assert json.dumps(to_json(run)) == ingested.stdout.strip()
