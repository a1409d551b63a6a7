"""How PitstopSaver names LangGraph's threads and checkpoints in a pitstop store.

Each (``thread_id``, ``checkpoint_ns``) is one pitstop run of workflow :data:`WORKFLOW`: its id
is the thread id for the root namespace and ``"<thread_id>::<checkpoint_ns>"`` for a
subgraph's (:func:`run_id_for`). A LangGraph checkpoint ``X`` of a run is pitstop checkpoint
``"X~<12 hex digits naming the run>"`` (:func:`stored_id`): pitstop ids are unique in a store
while one LangGraph id can live in several threads (``copy_thread`` keeps ids), hence the
suffix; ids of one run share it, so they sort as LangGraph's do. :func:`config_for` and
:func:`where` go between those names and LangGraph's configs.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Final

from langchain_core.runnables import RunnableConfig

WORKFLOW: Final = "langgraph"
"""The workflow name of every run that holds a LangGraph thread."""

NS_SEP: Final = "::"
"""Between a thread id and a subgraph's namespace in a run id."""
_ID_SEP: Final = "~"


@lru_cache(maxsize=4096)
def id_suffix(run_id: str) -> str:
    """What :func:`stored_id` appends to a LangGraph checkpoint id of ``run_id``. (Cached,
    and a C call once cached: ``put`` names two checkpoints with it on every step.)"""
    return _ID_SEP + hashlib.blake2b(run_id.encode(), digest_size=6).hexdigest()


def run_id_for(thread_id: str, checkpoint_ns: str = "") -> str:
    """The pitstop run that holds a LangGraph thread's namespace."""
    return f"{thread_id}{NS_SEP}{checkpoint_ns}" if checkpoint_ns else thread_id


def stored_id(checkpoint_id: str, run_id: str) -> str:
    """The pitstop checkpoint id of LangGraph checkpoint ``checkpoint_id`` in ``run_id``."""
    return f"{checkpoint_id}{id_suffix(run_id)}"


def langgraph_id(stored: str) -> str:
    """The LangGraph checkpoint id of a pitstop checkpoint id made by :func:`stored_id`."""
    return stored.rpartition(_ID_SEP)[0] or stored


def config_for(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    """The LangGraph config naming a checkpoint of a thread's namespace."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def where(config: RunnableConfig) -> tuple[str, str, str]:
    """The thread id, namespace and pitstop run id a config names."""
    conf = config["configurable"]
    thread_id = str(conf["thread_id"])
    ns = conf.get("checkpoint_ns") or ""
    return thread_id, ns, run_id_for(thread_id, ns)


__all__ = [
    "NS_SEP",
    "WORKFLOW",
    "config_for",
    "id_suffix",
    "langgraph_id",
    "run_id_for",
    "stored_id",
    "where",
]
