from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, BigInteger, ForeignKey, String, Text, UniqueConstraint, true
from sqlalchemy.orm import Mapped, mapped_column, relationship

from tensor_debugger.store.models.base import Base

if TYPE_CHECKING:
    from tensor_debugger.store.models.run import RunRecord


class TensorRecord(Base):
    """One stored tensor of a run; its values live in the array store at `store_key`.

    Summary statistics are over finite values (see `summary.py`); `digest` is "blake3:<hex>" (rows written before
    BLAKE3: "sha256:<hex>") of the logical dtype, the shape and the raw bytes in C order, so equal digests mean
    bit-identical tensors.

    Bit-identical tensors share one array: rows of several runs (of any sessions) may hold the same `store_key`,
    under the prefix of the run that wrote it or of an older run. These rows are the array's references: it is
    deleted with the last row that names it (`catalog.release_arrays`).
    """

    __tablename__ = "tensors"
    # ids never reused (in the API and a pair's tensor ids): see SessionRecord
    __table_args__ = (UniqueConstraint("run_id", "name", name="uq_tensors_run_name"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int]  # order of appearance in the run's files
    name: Mapped[str] = mapped_column(Text)
    source_file: Mapped[str] = mapped_column(Text)
    key_path: Mapped[list[Any]] = mapped_column(JSON, default=list)
    layer: Mapped[int | None]
    stage: Mapped[str | None] = mapped_column(String(200))
    shape: Mapped[list[Any]] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(40))  # logical dtype, torch's spelling
    store_key: Mapped[str] = mapped_column(String(200), index=True)  # "": no array (a summary-only tensor)
    nbytes: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(80), index=True)
    numel: Mapped[int] = mapped_column(BigInteger)
    min: Mapped[float | None]
    max: Mapped[float | None]
    mean: Mapped[float | None]
    std: Mapped[float | None]
    nan_count: Mapped[int] = mapped_column(BigInteger, default=0)
    inf_count: Mapped[int] = mapped_column(BigInteger, default=0)
    module_path: Mapped[str | None] = mapped_column(Text)  # from a module trace or a capture
    place: Mapped[str | None] = mapped_column(String(200))  # "inputs_args_0", "outputs", ...
    # a captured op's caller, "<file>:<line>": the innermost frame outside torch (a capture with level="op")
    source: Mapped[str | None] = mapped_column(Text)
    # a captured module input's parameter of the module's `forward` that its argument binds to ("x" for `attn(h)` and
    # for `attn(x=h)` alike), where the capture could read the signature; null for every other tensor
    parameter: Mapped[str | None] = mapped_column(Text)
    # False for a trace written with use_repr=True: shape, dtype and mean/std/min/max only, no array stored
    has_values: Mapped[bool] = mapped_column(default=True, server_default=true())
    # the tensor's summary (`summary_compare.Sketch.to_json`): a capture with values="summary" keeps it in place of the
    # values, ingest computes it for a stored tensor (ingest/stored_sketches.py); null in rows stored before that
    sketch: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    run: Mapped[RunRecord] = relationship(back_populates="tensors")
