"""Driving a LangGraph conversation across crashes: is the last turn finished? (docs/langgraph.md)

A driver that takes ``graph.get_state(config).next == ()`` as "the turn is finished, send the
next message" misreads a turn that a crash cut short: ``next`` leaves out the step's tasks
whose writes were saved before the kill (``tasks[i].result``), so it is ``()`` when all of
them finished, and a new input then starts from the step's parent checkpoint, dropping those
writes (the reply the turn produced). And while some task is due, ``next`` is not empty
although nothing waits for a person: sending the message as the answer to an interrupt that
does not exist drops the message.
:func:`next_move` tells the three cases apart, and :func:`turn` acts on it.

    python examples/langgraph_turns.py --store sqlite:///turns.db --die   # killed mid-turn
    python examples/langgraph_turns.py --store sqlite:///turns.db         # finishes the turn
    python examples/langgraph_turns.py --saver sqlite ...                 # LangGraph's SqliteSaver

The graph runs two nodes in one step; ``slow`` SIGKILLs the process (with ``--die``) after
``fast`` has finished, so ``fast``'s writes are saved and ``slow``'s are not: the window any
saver has, since LangGraph writes a step's checkpoint after all its nodes ran.
"""

from __future__ import annotations

import argparse
import operator
import os
import signal
import time
from typing import Annotated, Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, StateSnapshot

import pitstop

Move = Literal["new turn", "answer the interrupt", "finish the cut-short turn"]


# --8<-- [start:next_move]
def next_move(snapshot: StateSnapshot) -> Move:
    """What the last turn of a thread needs before the next message can be sent."""
    if any(task.interrupts for task in snapshot.tasks):
        return "answer the interrupt"   # graph.invoke(Command(resume=answer), config)
    if snapshot.tasks:
        # Tasks are due but none waits for a person: a crash cut the turn short. `next` is
        # no guide: it leaves out the tasks whose result was saved (tasks[i].result), so it
        # is () when all of them finished before the step's checkpoint was written. Finish
        # the turn first with graph.invoke(None, config): those tasks are not run again,
        # their saved writes are applied (a new input instead would drop them).
        return "finish the cut-short turn"
    return "new turn"                   # graph.invoke({"messages": [message]}, config)
# --8<-- [end:next_move]


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def build(saver: Any, die: bool, ran: str) -> Any:
    def fast(state: State) -> dict[str, Any]:
        with open(ran, "a") as out:
            out.write("fast\n")
        return {"log": ["fast"]}

    def slow(state: State) -> dict[str, Any]:
        if die:
            time.sleep(0.5)  # fast has finished and its writes are saved by now
            os.kill(os.getpid(), signal.SIGKILL)
        with open(ran, "a") as out:
            out.write("slow\n")
        return {"log": ["slow"]}

    builder = StateGraph(State)
    builder.add_node("fast", fast)
    builder.add_node("slow", slow)
    builder.add_edge(START, "fast")
    builder.add_edge(START, "slow")
    builder.add_edge("fast", END)
    builder.add_edge("slow", END)
    return builder.compile(checkpointer=saver)


def turn(graph: Any, config: dict[str, Any], message: str) -> None:
    """Send ``message`` as the thread's next turn, after finishing one a crash cut short."""
    move = next_move(graph.get_state(config))
    if move == "finish the cut-short turn":
        graph.invoke(None, config)
    elif move == "answer the interrupt":
        graph.invoke(Command(resume=message), config)
        return
    graph.invoke({"log": [message]}, config)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--store", default="sqlite:///turns.db")
    parser.add_argument("--saver", choices=["pitstop", "sqlite"], default="pitstop")
    parser.add_argument("--ran", default="ran.txt", help="file the nodes append to")
    parser.add_argument("--die", action="store_true")
    args = parser.parse_args(argv)
    config: dict[str, Any] = {"configurable": {"thread_id": "t1"}}
    if args.saver == "sqlite":
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver

        path = args.store.removeprefix("sqlite:///")
        saver: Any = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    else:
        from pitstop.integrations.langgraph import PitstopSaver

        saver = PitstopSaver(pitstop.open_store(args.store))
    graph = build(saver, args.die, args.ran)
    if args.die:
        graph.invoke({"log": ["hello"]}, config)  # killed inside
    print(f"before: {next_move(graph.get_state(config))}", flush=True)
    turn(graph, config, "second message")
    print(f"log: {graph.get_state(config).values['log']}", flush=True)


if __name__ == "__main__":
    main()
