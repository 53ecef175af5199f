"""Typed SQLAlchemy models, one per module."""

from tensor_debugger.models.base import Base
from tensor_debugger.models.comparison_result import ComparisonResultRecord
from tensor_debugger.models.pair import PAIR_STATUSES, PairRecord
from tensor_debugger.models.pair_override import OVERRIDE_ACTIONS, PairOverrideRecord
from tensor_debugger.models.problem import ProblemRecord
from tensor_debugger.models.run import RUN_STATUSES, RunRecord
from tensor_debugger.models.session import SessionRecord
from tensor_debugger.models.tensor import TensorRecord
from tensor_debugger.models.unmatched import UnmatchedRecord

__all__ = [
    "Base", "ComparisonResultRecord", "OVERRIDE_ACTIONS", "PAIR_STATUSES", "PairOverrideRecord", "PairRecord",
    "ProblemRecord", "RUN_STATUSES", "RunRecord", "SessionRecord", "TensorRecord", "UnmatchedRecord",
]
