"""What an ingest stored, read back, and compared bit for bit."""

from __future__ import annotations

import torch
from sqlalchemy import select
from tensor_debugger.services import Services
from tensor_debugger.store.dtypes import parse_dtype
from tensor_debugger.store.models import TensorRecord


def stored(services: Services, run_id: int) -> dict[str, TensorRecord]:
    with services.sessions() as db:
        return {t.name: t for t in db.scalars(select(TensorRecord).where(TensorRecord.run_id == run_id))}


def read_back(services: Services, record: TensorRecord) -> torch.Tensor:
    return services.store.read_whole(record.store_key, parse_dtype(record.dtype))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    raw = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}
    flat_a, flat_b = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    if a.dtype.is_complex and a.element_size() == 16:
        flat_a, flat_b = torch.view_as_real(flat_a), torch.view_as_real(flat_b)
        return bool(torch.equal(flat_a.view(torch.int64), flat_b.view(torch.int64)))
    if a.dtype == torch.bool:
        return bool(torch.equal(a, b))
    return bool(torch.equal(flat_a.view(raw[a.element_size()]), flat_b.view(raw[a.element_size()])))
