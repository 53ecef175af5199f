"""Answers on vision, audio, encoder-decoder and convolutional models no earlier round built (bench/RESULTS.md,
"answers on unseen models, round 13v"): the one answer that over-claimed, now fixed, and two right ones no earlier
round guards.

Fixed: a port that folds a BatchNorm into the conv before it (the same maths) diverges at that conv's outputs, and
the answer named the conv the culprit with nothing said of the models' own outputs, which agree within tolerance.
The answer now says so (`Divergence.outputs_within`), as it says where they are bit-identical; the same fold without
the norm's epsilon (a real bug, reaching the outputs) does not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import torch
from tensor_debugger import capture, find_divergence
from tensor_debugger.compare.reports.divergence_words import OUTPUTS_WITHIN
from tensor_debugger.settings import Settings
from torch import nn

from tests.support.model_ports import Port, config_of, jittered_pair, port_writer
from tests.support.sessions import compared
from tests.support.source_lines import marked_line

HERE = Path(__file__)
C = 4

line_of = partial(marked_line, HERE)


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, str, str], Port]]:
    with port_writer(tmp_path_factory.mktemp("ports")) as write:
        yield lambda family, tag, old, new: write(family, f"port13v_{family}_{tag}", old, new)


class ConvBn(nn.Module):
    """A conv, an eval-mode BatchNorm with running statistics of variance ~0.05 (eps 1e-2 is not negligible)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(C, C, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(C, eps=1e-2)
        self.bn.running_mean = torch.empty(C).uniform_(-0.2, 0.2)
        self.bn.running_var = torch.empty(C).uniform_(0.02, 0.1)
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)
        self.head = nn.Conv2d(C, C, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.bn(self.conv(x))))  # conv and norm
        return out


class Folded(nn.Module):
    """`source`'s conv and BatchNorm folded into one conv (as an inference port does); `eps`: whether the fold
    takes the norm's epsilon."""

    def __init__(self, source: ConvBn, eps: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(C, C, 3, padding=1)
        self.head = nn.Conv2d(C, C, 1)
        bn = source.bn
        mean, var, bias = bn.running_mean, bn.running_var, self.conv.bias
        assert mean is not None and var is not None and bias is not None
        with torch.no_grad():
            scale = bn.weight / torch.sqrt(var + (bn.eps if eps else 0.0))
            self.conv.weight.copy_(source.conv.weight * scale[:, None, None, None])
            bias.copy_(bn.bias - mean * scale)
            self.head.load_state_dict(source.head.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(torch.relu(self.conv(x)))  # folded
        return out


@pytest.mark.parametrize("eps", [True, False], ids=["the same maths", "the fold without eps"])
def test_a_batchnorm_folded_into_its_conv_says_whether_the_models_outputs_agree(settings: Settings, eps: bool) -> None:
    """Over-claimed before: the folded conv's outputs differ from the unfolded conv's (the norm is in its weights),
    so the conv was named the culprit, its weight a parameter that differs, and nothing more, though the models'
    outputs agree within tolerance. Now the answer says that they do; a fold without the norm's epsilon reaches the
    outputs, and the answer does not say it."""
    reference = ConvBn().eval()
    candidate = Folded(reference, eps).eval()
    x = torch.randn(2, C, 8, 8, generator=torch.Generator().manual_seed(5))
    found = find_divergence(reference, candidate, (x,), session="fold", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "ConvBn.conv/conv2d#1_outputs", repr(found)
    assert first.reference_source == line_of("conv and norm") and first.candidate_source == line_of("folded")
    assert not found.outputs_agree, repr(found)  # not bit for bit
    assert found.outputs_within is eps, repr(found)
    assert (OUTPUTS_WITHIN in repr(found)) is eps, repr(found)


def test_vit_mae_unshuffling_by_the_shuffle_names_the_index_and_what_it_holds(
    settings: Settings, ports: Callable[[str, str, str, str], Port]
) -> None:
    """Right (no earlier round guards an index made from another): ViTMAE's port takes the shuffle's indices for
    the unshuffle's (`ids_restore = ids_shuffle`), with the noise given. The first divergence is the index at its
    line on both sides, holding, bit for bit, the shuffle the reference made before it; the reference's `argsort`
    that the port dropped is named."""
    line = "ids_restore = torch.argsort(ids_shuffle, dim=1).to(sequence.device)"
    port = ports("vit_mae", "restore", line, "ids_restore = ids_shuffle.to(sequence.device)")
    config = config_of(
        "ViTMAEConfig",
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=16,
        patch_size=4,
        decoder_hidden_size=16,
        decoder_num_hidden_layers=1,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=32,
        mask_ratio=0.5,
    )
    reference, candidate = jittered_pair(port, "ViTMAEForPreTraining", config)
    g = torch.Generator().manual_seed(7)
    inputs = {"pixel_values": torch.randn(1, 3, 16, 16, generator=g), "noise": torch.rand(1, 16, generator=g)}
    found = find_divergence(reference, candidate, inputs, session="mae", data_dir=settings.data_dir)
    first = found.first
    embeddings = "ViTMAEForPreTraining.vit.embeddings"
    assert first is not None and first.reference == first.candidate == f"{embeddings}/to#2_outputs", repr(found)
    at = port.lines(line, "ids_restore = ids_shuffle")
    assert (first.reference_source, first.candidate_source) == at, repr(found)
    assert first.candidate_holds is not None and first.candidate_holds[0] == f"{embeddings}/to#1_outputs", repr(found)
    assert f"{embeddings}/argsort#2_outputs" in repr(found)
    assert found.culprits == [embeddings], repr(found)


def test_swin_patch_merging_in_another_order_is_found_by_a_summary_capture_of_the_merging_alone(
    settings: Settings, ports: Callable[[str, str, str, str], Port]
) -> None:
    """Right (no earlier round guards Swin's merging, nor ops crossed in a transformers model's session): the port
    interleaves the 2x2 neighbours row first (`for row ... for col`). Two summary captures limited by `modules=` to
    the merging layers: the session's first divergence is the concatenation at its line, with the two slices that
    the two sides take in each other's order named as crossed."""
    old = "for col in range(2) for row in range(2)]"
    port = ports("swin", "merge", old, "for row in range(2) for col in range(2)]")
    config = config_of(
        "SwinConfig", image_size=16, patch_size=2, embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=4
    )
    reference, candidate = jittered_pair(port, "SwinModel", config)
    pixels = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    for model, run in ((reference, "reference"), (candidate, "candidate")):
        with (
            torch.no_grad(),
            capture(
                model, "merge", run, data_dir=settings.data_dir, level="op", values="summary", modules="*.downsample*"
            ),
        ):
            model(pixel_values=pixels)
    first = compared(settings, "merge").first_divergence
    merging = "SwinModel.encoder.layers.0.downsample"
    assert first is not None and first.name == f"{merging}/cat#1_outputs", first
    assert (first.reference_source, first.candidate_source) == port.lines("input_feature = torch.cat(")
    crossed = {(c.reference, c.candidate) for c in first.crossed_before}
    assert crossed == {
        (f"{merging}/getitem#2_outputs", f"{merging}/getitem#3_outputs"),
        (f"{merging}/getitem#3_outputs", f"{merging}/getitem#2_outputs"),
    }, first


class OneOff(nn.Module):
    """Two linear layers; `off`: one element of the model's output 1e-2 off (the summaries' samples miss it)."""

    def __init__(self, off: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(256, 256), nn.Linear(256, 256)
        self.off = off

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.b(torch.relu(self.a(x)))
        if self.off:
            y = y.clone()
            y[3, 7] += 1e-2
        return y


def test_an_output_found_off_by_full_values_alone_is_not_said_to_agree(settings: Settings) -> None:
    """The sentence rests on the summaries' first divergence: where they found none and the second pass's full
    values find the model's own output off (one element, 1e-2), the outputs are not said to agree."""
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    found = find_divergence(OneOff(False).eval(), OneOff(True).eval(), (x,), session="one", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference == "OneOff_outputs", repr(found)
    assert not found.outputs_within and OUTPUTS_WITHIN not in repr(found), repr(found)
