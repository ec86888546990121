"""The durable trajectory store: sessions, token-exact turns, feedback, judgments, samples,
published policy versions, harness rollouts (groups, rollouts, verifier results) and preference
memory entries, in a SQLite file or a PostgreSQL database.

See :class:`Store` for the API and durability, :mod:`clawrl.store.schema` for the one schema
declaration (both dialects), :mod:`clawrl.store.migrations` for adding tables and columns,
:mod:`clawrl.store.chains` for prompts stored as deltas and :mod:`clawrl.store.copy` for
copying a store between backends.
"""

from clawrl.store.codec import (
    canonical_output,
    decode_floats,
    decode_ids,
    encode_floats,
    encode_ids,
    ids_digest,
    output_hash,
    prefix_digests,
)
from clawrl.store.core import Store
from clawrl.store.db import StoreConflict, is_url
from clawrl.store.learning import (
    DropReason,
    JudgmentRecord,
    SampleRecord,
    SampleStatus,
)
from clawrl.store.memory import MemoryEntryRecord, MemorySource, MemoryStatus
from clawrl.store.rollouts import (
    GroupDecision,
    RolloutGroupRecord,
    RolloutPurpose,
    RolloutRecord,
    RolloutResult,
    RolloutStatus,
    VerifierResultRecord,
)
from clawrl.store.schema import SCHEMA_VERSION
from clawrl.store.types import (
    ApiProtocol,
    FeedbackRecord,
    SessionRecord,
    SessionSource,
    SessionSummary,
    SideKind,
    TurnKind,
    TurnRecord,
    TurnStatus,
    UntrainableReason,
    new_id,
)
from clawrl.store.users import ForgottenUser, UserAdapterRecord, UserSummary
from clawrl.store.versions import FULL_WEIGHTS_FILE, PolicyVersionRecord, WeightsKind

__all__ = [
    "FULL_WEIGHTS_FILE",
    "SCHEMA_VERSION",
    "ApiProtocol",
    "DropReason",
    "FeedbackRecord",
    "ForgottenUser",
    "GroupDecision",
    "JudgmentRecord",
    "MemoryEntryRecord",
    "MemorySource",
    "MemoryStatus",
    "PolicyVersionRecord",
    "RolloutGroupRecord",
    "RolloutPurpose",
    "RolloutRecord",
    "RolloutResult",
    "RolloutStatus",
    "SampleRecord",
    "SampleStatus",
    "SessionRecord",
    "SessionSource",
    "SessionSummary",
    "SideKind",
    "Store",
    "StoreConflict",
    "TurnKind",
    "TurnRecord",
    "TurnStatus",
    "UntrainableReason",
    "UserAdapterRecord",
    "UserSummary",
    "VerifierResultRecord",
    "WeightsKind",
    "canonical_output",
    "decode_floats",
    "decode_ids",
    "encode_floats",
    "encode_ids",
    "ids_digest",
    "is_url",
    "new_id",
    "output_hash",
    "prefix_digests",
]
