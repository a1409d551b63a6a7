"""pitstop: checkpointing for long-running work.

Runs execute steps; after each step pitstop writes an immutable, verified checkpoint to a store
outside the process, so a run can resume after a crash, wait for a human without holding
compute, and be inspected, rewound and branched.

The public API is what this module exports, and what the modules of :data:`_PUBLIC_MODULES`
export (``pitstop.store``, ``pitstop.serde``, ``pitstop.runtime``, ``pitstop.stream``, the
tools, the LangGraph saver and ``pitstop.ui.create_app``). Every other module, the store's
layer folders (``pitstop.store.engine``...), the CLI, the inspector's pages and
``pitstop.display`` among them, is internal and may change between releases.
tests/test_exported_members.py keeps this list, the ``__all__`` lists and the reference docs
in step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .delta import Append, Merge
from .errors import (
    AmbiguousReferenceError,
    ArchiveError,
    BrokerUnavailableError,
    CacheKeyError,
    CheckpointNotFoundError,
    ChildFailedError,
    ChildRunError,
    ConflictError,
    CorruptCheckpointError,
    EncryptionKeyError,
    FieldEditError,
    InputError,
    LeaseLostError,
    MapItemError,
    NotFoundError,
    PartitionCountError,
    PitstopError,
    RerunError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    RunNotStartedError,
    ScheduleError,
    SchemaVersionError,
    SerializationError,
    StepFailedError,
    StoreError,
    StoreSchemaError,
    StreamError,
    TrimmedError,
    UndecodableRecordError,
    UnregisteredTypeError,
    UnsupportedStoreError,
)
from .lazy import lazy_getattr as _lazy_getattr
from .model import Checkpoint, CheckpointSummary, Run, RunStatus
from .rng import epoch_order, rng_state, set_rng_state
from .store import (
    Input,
    Lease,
    Problem,
    PruneReport,
    RetentionPolicy,
    Store,
    StoreStats,
    open_store,
)

__version__ = "0.1.0"

_PUBLIC_MODULES = (
    "pitstop.archive",
    "pitstop.edits",
    "pitstop.failures",
    "pitstop.fieldpath",
    "pitstop.integrations.langgraph",
    "pitstop.observe",
    "pitstop.observe.metrics",
    "pitstop.observe.tracing",
    "pitstop.observe.usage",
    "pitstop.owners",
    "pitstop.runtime",
    "pitstop.serde",
    "pitstop.store",
    "pitstop.stream",
    "pitstop.ui",
)
"""The modules besides this one whose ``__all__`` is public API (the reference documents
objects from them)."""

# The runtime (and asyncio with it) and the serialisers are imported on first use, so tools
# that only read run rows, like `pitstop runs`, start fast: `import pitstop` loads neither.
_LAZY = {
    **dict.fromkeys(
        ("CachePolicy", "CheckpointPolicy", "Checkpointer", "ChildResult", "Retry", "RunResult",
         "StepContext", "Worker", "Workflow", "finish", "goto", "send"),
        "runtime",
    ),
    **dict.fromkeys(("MsgpackSerializer", "PickleSerializer", "TypeRegistry", "register"),
                    "serde"),
    "Encryption": "store.encoding.sealed",  # (cryptography is imported only by a store that seals)
}

if TYPE_CHECKING:
    from .runtime import (
        CachePolicy,
        Checkpointer,
        CheckpointPolicy,
        ChildResult,
        Retry,
        RunResult,
        StepContext,
        Worker,
        Workflow,
        finish,
        goto,
        send,
    )
    from .serde import MsgpackSerializer, PickleSerializer, TypeRegistry, register
    from .store.encoding.sealed import Encryption


__getattr__ = _lazy_getattr(__name__, globals(), _LAZY)


__all__ = [
    "AmbiguousReferenceError",
    "Append",
    "ArchiveError",
    "BrokerUnavailableError",
    "CacheKeyError",
    "CachePolicy",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CheckpointPolicy",
    "CheckpointSummary",
    "Checkpointer",
    "ChildFailedError",
    "ChildResult",
    "ChildRunError",
    "ConflictError",
    "CorruptCheckpointError",
    "Encryption",
    "EncryptionKeyError",
    "FieldEditError",
    "Input",
    "InputError",
    "Lease",
    "LeaseLostError",
    "MapItemError",
    "Merge",
    "MsgpackSerializer",
    "NotFoundError",
    "PartitionCountError",
    "PickleSerializer",
    "PitstopError",
    "Problem",
    "PruneReport",
    "RerunError",
    "RetentionPolicy",
    "Retry",
    "Run",
    "RunBusyError",
    "RunExistsError",
    "RunNotFoundError",
    "RunNotStartedError",
    "RunResult",
    "RunStatus",
    "ScheduleError",
    "SchemaVersionError",
    "SerializationError",
    "StepContext",
    "StepFailedError",
    "Store",
    "StoreError",
    "StoreSchemaError",
    "StoreStats",
    "StreamError",
    "TrimmedError",
    "TypeRegistry",
    "UndecodableRecordError",
    "UnregisteredTypeError",
    "UnsupportedStoreError",
    "Worker",
    "Workflow",
    "__version__",
    "epoch_order",
    "finish",
    "goto",
    "open_store",
    "register",
    "rng_state",
    "send",
    "set_rng_state",
]
