"""Typed SQLAlchemy models, one per module."""

from tensor_debugger.models.base import Base
from tensor_debugger.models.problem import ProblemRecord
from tensor_debugger.models.run import RUN_STATUSES, RunRecord
from tensor_debugger.models.session import SessionRecord
from tensor_debugger.models.tensor import TensorRecord

__all__ = ["RUN_STATUSES", "Base", "ProblemRecord", "RunRecord", "SessionRecord", "TensorRecord"]
