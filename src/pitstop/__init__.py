"""pitstop: checkpointing for long-running work.

Runs execute steps; after each step pitstop writes an immutable, verified checkpoint to a store
outside the process, so a run can resume after a crash, wait for a human without holding
compute, and be inspected, rewound and branched.

The public API is what this module exports; everything else may change between releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .delta import Append, Merge
from .errors import (
    ArchiveError,
    CheckpointNotFoundError,
    ChildFailedError,
    ChildRunError,
    ConflictError,
    CorruptCheckpointError,
    FieldEditError,
    InputError,
    LeaseLostError,
    MapItemError,
    NotFoundError,
    PitstopError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    RunNotStartedError,
    SchemaVersionError,
    SerializationError,
    StepFailedError,
    StoreError,
    StoreSchemaError,
    UnregisteredTypeError,
    UnsupportedStoreError,
)
from .lazy import lazy_getattr
from .model import Checkpoint, CheckpointSummary, Run, RunStatus
from .rng import rng_state, set_rng_state
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

# The runtime (and asyncio with it) and the serialisers are imported on first use, so tools
# that only read run rows, like `pitstop runs`, start fast: `import pitstop` loads neither.
_LAZY = {
    **dict.fromkeys(
        ("CheckpointPolicy", "Checkpointer", "ChildResult", "Retry", "RunResult", "StepContext",
         "Worker", "Workflow", "finish", "goto", "send"),
        "runtime",
    ),
    **dict.fromkeys(("MsgpackSerializer", "PickleSerializer", "TypeRegistry", "register"),
                    "serde"),
}

if TYPE_CHECKING:
    from .runtime import (
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


__getattr__ = lazy_getattr(__name__, globals(), _LAZY)


__all__ = [
    "Append",
    "ArchiveError",
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
    "FieldEditError",
    "Input",
    "InputError",
    "Lease",
    "LeaseLostError",
    "MapItemError",
    "Merge",
    "MsgpackSerializer",
    "NotFoundError",
    "PickleSerializer",
    "PitstopError",
    "Problem",
    "PruneReport",
    "RetentionPolicy",
    "Retry",
    "Run",
    "RunBusyError",
    "RunExistsError",
    "RunNotFoundError",
    "RunNotStartedError",
    "RunResult",
    "RunStatus",
    "SchemaVersionError",
    "SerializationError",
    "StepContext",
    "StepFailedError",
    "Store",
    "StoreError",
    "StoreSchemaError",
    "StoreStats",
    "TypeRegistry",
    "UnregisteredTypeError",
    "UnsupportedStoreError",
    "Worker",
    "Workflow",
    "__version__",
    "finish",
    "goto",
    "open_store",
    "register",
    "rng_state",
    "send",
    "set_rng_state",
]
