"""Grouped-query attention (4 query heads sharing 2 key/value heads) and its ports: a port that tiles the heads
(`GroupedAttention(port=True)`), eager attention against SDPA (`EagerAttention`), masks as additive floats or bools
(`Masks`). `line_of` finds the lines of this file marked with a comment, which a captured op's `source` names."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (the name models use)
from torch import nn

from tests.support.source_lines import marked_line

HERE = Path(__file__)
DIM, HEADS, KV_HEADS = 16, 4, 2

line_of = partial(marked_line, HERE)  # `path:line` of this file's line ending with the comment `marker`


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """Each key/value head `n` times in a row, as transformers' `repeat_kv` does it."""
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n, t, d).reshape(b, h * n, t, d)


def port_repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    """The port's: the heads tiled (0 1 0 1), not repeated in place (0 0 1 1)."""
    return x.repeat(1, n, 1, 1)  # port repeat_kv


class GroupedAttention(nn.Module):
    """Attention with 4 query heads sharing 2 key/value heads."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q_proj = nn.Linear(DIM, DIM, bias=False)
        self.k_proj, self.v_proj = (nn.Linear(DIM, DIM // HEADS * KV_HEADS, bias=False) for _ in range(2))
        self.o_proj = nn.Linear(DIM, DIM, bias=False)
        self.port = port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, HEADS, -1).transpose(1, 2)
        k = self.k_proj(x).view(b, t, KV_HEADS, -1).transpose(1, 2)
        v = self.v_proj(x).view(b, t, KV_HEADS, -1).transpose(1, 2)
        if self.port:
            k, v = port_repeat_kv(k, HEADS // KV_HEADS), port_repeat_kv(v, HEADS // KV_HEADS)
            scores = q @ k.transpose(-1, -2)  # port scores
        else:
            k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
            scores = q @ k.transpose(-1, -2)  # reference scores
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, DIM)
        result: torch.Tensor = self.o_proj(out)
        return result


class MaskedBlock(nn.Module):
    """Self-attention scores masked by an additive float mask (eager attention's) or a bool one (SDPA's)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        scores = h @ h.transpose(-1, -2)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out: torch.Tensor = scores.softmax(-1) @ h
        return out


class Masks(nn.Module):
    """Blocks in a ModuleList given a mask the model builds: additive floats, or bools (`bool_mask`); `off`, the
    port's mask shifted by one key."""

    def __init__(self, bool_mask: bool, off: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList([MaskedBlock()])
        self.bool_mask, self.off = bool_mask, off

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        if self.off:
            keep = keep.roll(1, -1)  # port mask
        mask = (
            keep[:, None, :]
            if self.bool_mask
            else torch.zeros(keep[:, None, :].shape).masked_fill(~keep[:, None, :], -1e9)
        )
        for layer in self.layers:
            x = layer(x, mask)
        return x


class EagerAttention(nn.Module):
    """Grouped attention by matmul and softmax over repeated keys (`sdpa`: by F.scaled_dot_product_attention with
    enable_gqa, no repeat); the eager one also reshapes its input first, as a port's bookkeeping might."""

    def __init__(self, sdpa: bool, scale: float = 1.0) -> None:
        super().__init__()
        self.attn = GroupedAttention(False)
        self.sdpa, self.scale = sdpa, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, (b, t, _) = self.attn, x.shape
        if not self.sdpa:
            x = x.reshape(b, t, DIM)
        q = a.q_proj(x).view(b, t, HEADS, -1).transpose(1, 2)
        k = a.k_proj(x).view(b, t, KV_HEADS, -1).transpose(1, 2)
        v = a.v_proj(x).view(b, t, KV_HEADS, -1).transpose(1, 2)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=self.scale * (DIM // HEADS) ** -0.5)
        else:
            k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
            out = ((q @ k.transpose(-1, -2)) * (DIM // HEADS) ** -0.5).softmax(-1) @ v
        result: torch.Tensor = a.o_proj(out.transpose(1, 2).reshape(b, t, DIM))
        return result
