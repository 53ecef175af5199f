"""The sessions the at-a-glance page tests read (tests/web/test_glance_pages.py): a traced tiny Llama whose
candidate has a perturbed MLP (long module names), and a 64 x 256 pair with a long name whose candidate differs
at [40, 200], built through the services as `compare` does."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tensor_debugger.cli.compare_output import compare_request
from tensor_debugger.compare.pipeline import compare_runs
from tensor_debugger.compare.reports.compare_report import to_json
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings

from tests.support.traces import WrittenTraces

LONG_NAME = "model.layers.17.self_attn.o_proj"
SPOT = (40, 200)


@dataclass(frozen=True)
class GlanceSessions:
    trace: int  # a traced tiny Llama, eager against perturbed
    wide: int  # one 64 x 256 pair named LONG_NAME (its twin, ...k_proj, beside it)
    named: int  # h.embed [1, 8, 64] and h.logits [1, 8, 1000], dims named (batch, tokens, hidden / vocab)
    fixed: int  # the same tiny Llama, eager against sdpa with a rerun of eager (the noise floor): the "after the
    # fix" of `trace` on compare-sessions


def write_wide(folder: Path) -> tuple[Path, Path]:
    """Two .pth files of 64 x 256 tensors named like a model's projections; the candidate's o_proj differs a
    little everywhere and by 0.5 at SPOT."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(7)
    reference = {name: torch.randn(64, 256, generator=generator) for name in (LONG_NAME, LONG_NAME[:-6] + "k_proj")}
    candidate = {name: t.clone() for name, t in reference.items()}
    candidate[LONG_NAME] += 1e-4 * torch.randn(64, 256, generator=generator)
    candidate[LONG_NAME][SPOT] += 0.5
    torch.save(reference, folder / "ref.pth")
    torch.save(candidate, folder / "cand.pth")
    return folder / "ref.pth", folder / "cand.pth"


NAMED_DIMS = ("*embed=batch,tokens,hidden", "*logits=batch,tokens,vocab")


def write_named(folder: Path) -> tuple[Path, Path]:
    """Two .pth files: h.embed [1, 8, 64] and h.logits [1, 8, 1000]; the candidate differs from token 3 on, by 1e-3
    in the embedding and 0.5 at logit 500."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(11)
    reference = {
        "h.embed": torch.randn(1, 8, 64, generator=generator),
        "h.logits": torch.randn(1, 8, 1000, generator=generator),
    }
    candidate = {name: t.clone() for name, t in reference.items()}
    candidate["h.embed"][0, 3:] += 1e-3
    candidate["h.logits"][0, 3:, 500] += 0.5
    torch.save(reference, folder / "ref.pth")
    torch.save(candidate, folder / "cand.pth")
    return folder / "ref.pth", folder / "cand.pth"


def build_glance_sessions(data: Path, work: Path, traces: WrittenTraces) -> GlanceSessions:
    services = open_services(Settings(data_dir=data, demo=False))
    try:
        trace_request = compare_request(traces["eager"], traces["perturbed"], "trace", None, None)
        trace = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, trace_request, "").payload)[
                "session"
            ]["id"]
        )
        ref, cand = write_wide(work / "wide")
        wide_request = compare_request(ref, cand, "wide", None, None)
        wide = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, wide_request, "").payload)[
                "session"
            ]["id"]
        )
        fixed_request = compare_request(
            traces["eager"], traces["sdpa"], "trace-fixed", None, None, noise=traces["eager"]
        )
        fixed = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, fixed_request, "").payload)[
                "session"
            ]["id"]
        )
        ref, cand = write_named(work / "named")
        named_request = compare_request(ref, cand, "named dims", None, None, dims=NAMED_DIMS)
        named = int(
            to_json(compare_runs(services.ingestor, services.context, services.compute, named_request, "").payload)[
                "session"
            ]["id"]
        )
        return GlanceSessions(trace, wide, named, fixed)
    finally:
        services.close()
