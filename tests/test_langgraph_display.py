"""`pitstop show` and `diff` of a LangGraph thread print channel values decoded (message
contents readable), and decoding them never runs code."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from typing import Any

import ormsgpack
import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

import pitstop
from conftest import ROOT, SHARED_BACKENDS
from pitstop import Store
from pitstop.cli.app import run
from pitstop.integrations.langgraph import PitstopSaver
from pitstop.integrations.langgraph_values import display_value, pack_typed


def _chat(store: Store, thread: str) -> None:
    def bot(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="The parcel left Lyon at 9:40.")]}

    builder = StateGraph(MessagesState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    graph = builder.compile(checkpointer=PitstopSaver(store))
    graph.invoke({"messages": [HumanMessage(content="Where is my parcel?")]},
                 {"configurable": {"thread_id": thread}})


def _cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> str:
    code = run([*args, "--store", url])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize("store_url", SHARED_BACKENDS, indirect=True)  # the CLI opens its own
def test_show_and_diff_decode_messages(
    store_url: str, store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    _chat(store, "t-show")
    shown = json.loads(_cli(capsys, store_url, "show", "t-show", "--json"))
    messages = shown["state"]["messages"]
    assert [(m["$type"].rsplit(".", 1)[-1], m["content"]) for m in messages] == [
        ("HumanMessage", "Where is my parcel?"),
        ("AIMessage", "The parcel left Lyon at 9:40."),
    ]
    text = _cli(capsys, store_url, "show", "t-show", "--field", "messages[-1].content")
    assert text.rstrip().endswith('"The parcel left Lyon at 9:40."')
    first = store.history("t-show", limit=None)[-1].id
    changes = json.loads(_cli(capsys, store_url, "diff", first, "t-show", "--json"))["changes"]
    assert {c["path"] for c in changes} >= {"messages", "__start__"}
    assert "$bytes" not in json.dumps(changes) and "$bytes" not in json.dumps(shown)
    plain = _cli(capsys, store_url, "diff", first, "t-show")
    assert "Where is my parcel?" in plain


def test_values_of_every_kind_show_as_plain_data() -> None:
    import datetime
    import decimal
    import uuid

    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    serde = JsonPlusSerializer()
    when = datetime.datetime(2025, 3, 1, 12, 30, tzinfo=datetime.UTC)
    ident = uuid.UUID(int=7)
    value = {"at": when, "id": ident, "price": decimal.Decimal("9.50"), "tags": {"a"},
             "day": datetime.date(2025, 3, 1), "raw": b"\x00\x01", "none": None}
    shown = display_value(pack_typed(serde.dumps_typed(value)))
    assert shown == {"at": when.isoformat(), "id": ident.hex, "price": "9.50", "tags": ["a"],
                     "day": "2025-03-01", "raw": b"\x00\x01", "none": None}
    assert display_value(pack_typed(serde.dumps_typed(None))) is None
    assert display_value(pack_typed(("msgpack+aes", b"secret"))) == {
        "$type": "msgpack+aes", "$bytes": 6}


class _Boom:
    def __reduce__(self) -> Any:
        return (exec, ("import sys; sys.modules['__main__'].ran = True",))


def test_decoding_never_runs_code(tmp_path: Any) -> None:
    """An extension naming os.system, and a pickle that would run code when loaded, show as
    data; the pickle is unpickled only when the caller says the store opted in."""
    hostile = ormsgpack.Ext(2, ormsgpack.packb(["os", "system", {"command": "exit 3"}]))
    stored = pack_typed(("msgpack", ormsgpack.packb({"x": hostile})))
    assert display_value(stored) == {"x": {"$type": "os.system", "command": "exit 3"}}
    pickled = pack_typed(("pickle", pickle.dumps(_Boom())))
    assert display_value(pickled) == {"$type": "pickle", "$bytes": len(pickle.dumps(_Boom()))}

    # In a fresh interpreter: nothing imported for it, nothing run, no langgraph needed.
    code = f"""
import sys
from pitstop.integrations.langgraph_values import display_value
print(repr(display_value({stored!r})), repr(display_value({pickled!r})))
assert not getattr(sys.modules['__main__'], 'ran', False)
assert 'langgraph' not in sys.modules and 'langchain_core' not in sys.modules, sorted(sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT / "src")}, check=False)
    assert done.returncode == 0, done.stderr


def test_pickle_values_show_when_the_store_opted_in(tmp_path: Any) -> None:
    from pitstop.cli.common import state_view

    url = f"sqlite:///{tmp_path / 'pickled.db'}"
    with pitstop.open_store(url) as store:
        store.save("r", {"v": pack_typed(("pickle", pickle.dumps({"kept": [1, 2]})))},
                   metadata={"langgraph": {"metadata": {}, "checkpoint": {}}})
        latest = store.latest("r")
        assert latest is not None
        size = len(pickle.dumps({"kept": [1, 2]}))
        assert state_view(store, latest) == {"v": {"$type": "pickle", "$bytes": size}}
    with pitstop.open_store(url, serializer=pitstop.PickleSerializer()) as store:
        latest = store.latest("r")
        assert latest is not None
        assert state_view(store, latest) == {"v": {"kept": [1, 2]}}


def test_short_ids_of_a_thread_are_unique_and_name_its_checkpoints(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every stored id of a thread ends with the same tag naming the thread: the short id is
    the end of LangGraph's own id, so `show t1@ID` and `diff` name one checkpoint (#30)."""
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    with pitstop.open_store(url) as store:
        _chat(store, "t1")
        _chat(store, "t1")
        ids = [c.id for c in store.history("t1", limit=None)]
    lines = _cli(capsys, url, "history", "t1").splitlines()
    shown = [word for line in lines for word in line.split() if any(
        cid.rpartition("~")[0].endswith(word) for cid in ids) and len(word) >= 8]
    assert len(shown) == len(ids) == len(set(shown)), lines
    for cid, short in zip(ids, shown, strict=True):
        picked = json.loads(_cli(capsys, url, "show", f"t1@{short}", "--json"))
        assert picked["checkpoint"]["id"] == cid
    diffed = json.loads(_cli(capsys, url, "diff", f"t1@{shown[-1]}", f"t1@{shown[0]}", "--json"))
    assert diffed["a"]["id"] == ids[-1] and diffed["b"]["id"] == ids[0]


@pytest.mark.parametrize("saver", ["pitstop", "sqlite"])
@pytest.mark.slow
def test_a_turn_cut_short_by_a_kill_is_finished_before_the_next_message(
    tmp_path: Any, saver: str
) -> None:
    """docs/langgraph.md's check (examples/langgraph_turns.py, #30): after a SIGKILL between
    a node's saved writes and the step's checkpoint, `tasks` holds that node's result and no
    interrupt; the driver finishes the turn (the node is not run again) and then sends the
    message. LangGraph's SqliteSaver leaves the same state (the window is LangGraph's)."""
    if saver == "sqlite":
        pytest.importorskip("langgraph.checkpoint.sqlite")
    script = str(ROOT / "examples" / "langgraph_turns.py")
    args = ["--saver", saver, "--store", f"sqlite:///{tmp_path / 'turns.db'}",
            "--ran", str(tmp_path / "ran.txt")]
    killed = subprocess.run([sys.executable, script, *args, "--die"], capture_output=True,
                            text=True, timeout=120, check=False)
    assert killed.returncode == -9, killed.stderr
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          timeout=120, check=True)
    assert "before: finish the cut-short turn" in done.stdout, done.stdout
    assert "log: ['hello', 'fast', 'slow', 'second message', 'fast', 'slow']" in done.stdout
    ran = (tmp_path / "ran.txt").read_text().split()
    assert sorted(ran) == ["fast", "fast", "slow", "slow"]  # fast was not run again


def test_the_langgraph_page_shows_the_turn_check_as_tested() -> None:
    page = (ROOT / "docs" / "langgraph.md").read_text()
    assert '--8<-- "langgraph_turns.py:next_move"' in page
