"""The run/step runtime: workflows, their execution, leases and the background writer."""

from ..errors import StepFailedError
from .cache import CachePolicy
from .children import ChildResult
from .context import StepContext
from .engine import RunResult
from .loop import Checkpointer
from .policies import CheckpointPolicy, Finish, Goto, Retry, WorkflowDurability, finish, goto
from .worker import Worker, WorkerStats, run_until_idle
from .workflow import Workflow, send

__all__ = [
    "CachePolicy",
    "CheckpointPolicy",
    "Checkpointer",
    "ChildResult",
    "Finish",
    "Goto",
    "Retry",
    "RunResult",
    "StepContext",
    "StepFailedError",
    "Worker",
    "WorkerStats",
    "Workflow",
    "WorkflowDurability",
    "finish",
    "goto",
    "run_until_idle",
    "send",
]
