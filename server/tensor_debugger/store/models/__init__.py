"""Typed SQLAlchemy models, one per module."""

from tensor_debugger.store.models.array_folder import ArrayFolderRecord
from tensor_debugger.store.models.base import Base
from tensor_debugger.store.models.comparison_result import ComparisonResultRecord
from tensor_debugger.store.models.identity import IDENTITY_SLOT, DatabaseIdentityRecord
from tensor_debugger.store.models.pair import PAIR_STATUSES, PairRecord
from tensor_debugger.store.models.pair_override import OVERRIDE_ACTIONS, PairOverrideRecord
from tensor_debugger.store.models.problem import ProblemRecord
from tensor_debugger.store.models.run import RUN_STATUSES, RunRecord
from tensor_debugger.store.models.session import SessionRecord
from tensor_debugger.store.models.session_figures import SessionFiguresRecord
from tensor_debugger.store.models.sign_out import SignOutRecord
from tensor_debugger.store.models.tensor import TensorRecord
from tensor_debugger.store.models.unmatched import UnmatchedRecord

__all__ = [
    "ArrayFolderRecord",
    "Base",
    "ComparisonResultRecord",
    "DatabaseIdentityRecord",
    "IDENTITY_SLOT",
    "OVERRIDE_ACTIONS",
    "PAIR_STATUSES",
    "PairOverrideRecord",
    "PairRecord",
    "ProblemRecord",
    "RUN_STATUSES",
    "RunRecord",
    "SessionFiguresRecord",
    "SessionRecord",
    "SignOutRecord",
    "TensorRecord",
    "UnmatchedRecord",
]
