"""The durable trajectory store: sessions, token-exact turns and feedback in one SQLite file.

See :class:`Store` for the API and durability, :mod:`clawrl.store.schema` for the one schema
declaration and :mod:`clawrl.store.migrations` for adding tables and columns.
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
from clawrl.store.learning import (
    DropReason,
    JudgmentRecord,
    SampleRecord,
    SampleStatus,
)
from clawrl.store.schema import SCHEMA_VERSION
from clawrl.store.sqlite import Store
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

__all__ = [
    "SCHEMA_VERSION",
    "ApiProtocol",
    "DropReason",
    "FeedbackRecord",
    "JudgmentRecord",
    "SampleRecord",
    "SampleStatus",
    "SessionRecord",
    "SessionSource",
    "SessionSummary",
    "SideKind",
    "Store",
    "TurnKind",
    "TurnRecord",
    "TurnStatus",
    "UntrainableReason",
    "canonical_output",
    "decode_floats",
    "decode_ids",
    "encode_floats",
    "encode_ids",
    "ids_digest",
    "new_id",
    "output_hash",
    "prefix_digests",
]
