"""State that grows (issue #12): pitstop.Append / pitstop.Merge in steps, declarations and
store.save; chunked values in every store (sharing, in-place edits, corruption, GC with forks
and concurrent saves, export/import, SIGKILL, upgrade); the LangGraph saver's messages
channel and DeltaChannel. The chunker alone is tested in test_chunks.py."""

from __future__ import annotations

import dataclasses
import random
import string
import subprocess
import sys
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest

import pitstop
from conftest import ROOT
from pitstop import Append, CorruptCheckpointError, Merge, RetentionPolicy, Store
from pitstop.delta import combine
from pitstop.store.encoding.records import decode_field_map, is_chunk_key


def test_apply_and_combine() -> None:
    base = [1, 2]
    assert Append([3]).apply(base) == [1, 2, 3]
    assert base == [1, 2]  # never changed in place
    assert Append((4, 5)).apply(None) == [4, 5]
    assert Merge({"a": 1}, b=2).apply({"a": 0, "z": 9}) == {"a": 1, "z": 9, "b": 2}
    assert list(Merge({"new": 1}).apply({"x": 0, "y": 1})) == ["x", "y", "new"]
    assert combine(Append([1]), Append([2])) == Append([1, 2])
    assert combine(Merge(a=1), Merge(a=2, b=3)) == Merge(a=2, b=3)
    with pytest.raises(TypeError, match="messages"):
        combine(Append([1]), Merge(a=1), field="messages")
    with pytest.raises(TypeError, match=r"'notes'.*str"):
        Append(["x"]).apply("text", field="notes")
    with pytest.raises(TypeError, match=r"'docs'.*list"):
        Merge(a=1).apply([], field="docs")
    with pytest.raises(TypeError, match="Append takes"):
        Append("abc")  # type: ignore[arg-type]
    assert repr(Append([1])) == "pitstop.Append([1])"


def test_step_results_append_and_merge(store: pitstop.Store) -> None:
    wf = pitstop.Workflow("grow-results")

    @wf.step
    def first(state: dict[str, Any], ctx: Any) -> Any:
        return {"messages": Append([{"role": "user", "content": "hi"}]), "docs": Merge(a=1)}

    @wf.step
    def second(state: dict[str, Any], ctx: Any) -> Any:
        assert state["messages"][-1]["content"] == "hi"  # later steps see the applied value
        return pitstop.finish({"messages": Append(["bye"]), "docs": Merge({"b": 2})})

    result = wf.start(store, {"messages": ["start"]})
    state = store.latest(result.run_id).state  # type: ignore[union-attr]
    assert state["messages"] == ["start", {"role": "user", "content": "hi"}, "bye"]
    assert state["docs"] == {"a": 1, "b": 2}  # Merge on a missing field starts a dict


def test_declared_fields_append_what_steps_return(store: pitstop.Store) -> None:
    class State(TypedDict):
        messages: Annotated[list[str], Append]
        seen: Annotated[dict[str, int], Merge]
        last: str

    wf = pitstop.Workflow("grow-declared", state=State)

    @wf.step
    def talk(state: State, ctx: Any) -> Any:
        update = {"messages": [f"m{len(state['messages'])}"], "seen": {"talk": 1}, "last": "t"}
        if len(state["messages"]) < 3:
            return pitstop.goto("talk", update)
        return update

    result = wf.start(store, {"messages": [], "seen": {"start": 0}, "last": ""})
    state = store.latest(result.run_id).state  # type: ignore[union-attr]
    assert state["messages"] == ["m0", "m1", "m2", "m3"]
    assert state["seen"] == {"start": 0, "talk": 1}
    assert state["last"] == "t"


def test_declared_dataclass_field(store: pitstop.Store) -> None:
    @dataclasses.dataclass
    class State:
        log: Annotated[list[int], Append] = dataclasses.field(default_factory=list)

    wf = pitstop.Workflow("grow-dataclass", state=State)

    @wf.step
    def one(state: State, ctx: Any) -> Any:
        return {"log": [1]}

    @wf.step
    def two(state: State, ctx: Any) -> Any:
        return {"log": Append([2, 3])}  # an explicit delta is taken as it is

    result = wf.start(store, State(log=[0]))
    assert store.latest(result.run_id).state["log"] == [0, 1, 2, 3]  # type: ignore[union-attr]


def test_append_to_a_field_that_is_not_a_list_names_it(store: pitstop.Store) -> None:
    wf = pitstop.Workflow("grow-wrong")

    @wf.step
    def bad(state: dict[str, Any], ctx: Any) -> Any:
        return {"count": Append([1])}

    with pytest.raises(TypeError, match=r"'count'.*int"):
        wf.start(store, {"count": 5})


# -- chunked values in the store ----------------------------------------------------------------


def _message(rng: random.Random, i: int, size: int = 2048) -> dict[str, Any]:
    return {"i": i, "content": "".join(rng.choices(string.ascii_letters, k=size))}


def _grow(store: Store, run_id: str, turns: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs.append(_message(rng, i))
        store.save(run_id, {"messages": msgs, "turn": i})  # the whole list, no hint
    return msgs


def _chunk_keys(store: Store, checkpoint_id: str) -> list[bytes]:
    def read(tx: Any) -> list[bytes]:
        fields = tx.one("SELECT fields FROM pitstop_checkpoints WHERE id = ?", (checkpoint_id,))
        ref = decode_field_map(bytes(fields[0]))["messages"]
        keys = store._value_codec.chunks_below(ref, store._read_values_alone)  # type: ignore[attr-defined]
        return sorted(keys)

    return store._tx(read)  # type: ignore[attr-defined,no-any-return]


def test_growing_list_stores_each_message_about_once(store: Store) -> None:
    msgs = _grow(store, "conv", 120)
    latest = store.latest("conv")
    assert latest is not None and latest.state["messages"] == msgs
    late = store.history("conv", limit=50)
    assert all(s.added < 4096 for s in late), [s.added for s in late]  # ~one message each
    final = len(pitstop.MsgpackSerializer().dumps(msgs))
    assert store.stats().bytes < 2 * final
    assert store.verify() == []
    # every earlier checkpoint still holds its own prefix
    for summary in store.history("conv", limit=None)[::17]:
        ckpt = store.get(summary.id)
        assert ckpt.state["messages"] == msgs[: ckpt.state["turn"] + 1]


def test_in_place_edit_of_an_early_item_is_stored(store: Store) -> None:
    msgs = _grow(store, "conv", 60)
    before = store.latest("conv")
    assert before is not None
    msgs[3]["content"] = "edited in place"  # same list, same dict objects: identity proves nothing
    after = store.save("conv", {"messages": msgs, "turn": 99})
    assert store.get(after.id).state["messages"][3]["content"] == "edited in place"
    assert store.get(before.id).state["messages"][3]["content"] != "edited in place"
    shared = set(_chunk_keys(store, before.id)) & set(_chunk_keys(store, after.id))
    assert shared  # only the chunk holding item 3 (and the tree above it) is new


def test_a_bytearray_in_a_grown_list_keeps_its_type(store: Store) -> None:
    """A whole-value save checks only the part after the unchanged prefix for raw buffers
    (while the prefix holds no bin header): a bytearray appended, or put where equal bytes
    were in that prefix, still loads back a bytearray."""
    msgs: list[Any] = _grow(store, "conv", 40)
    msgs.append({"role": "tool", "content": bytearray(b"appended")})
    store.save("conv", {"messages": msgs, "turn": 40})
    msgs[2] = {"role": "tool", "content": b"equal bytes"}
    store.save("conv", {"messages": msgs, "turn": 41})
    msgs[2] = {"role": "tool", "content": bytearray(b"equal bytes")}
    last = store.save("conv", {"messages": msgs, "turn": 42})
    for ckpt in (store.latest("conv"), store.get(last.id)):
        assert ckpt is not None and ckpt.state["messages"] == msgs
        assert type(ckpt.state["messages"][2]["content"]) is bytearray
        assert type(ckpt.state["messages"][-1]["content"]) is bytearray


def test_append_and_merge_as_values_in_store_save(store: Store) -> None:
    rng = random.Random(5)
    first = [_message(rng, i) for i in range(80)]
    store.save("r", {"messages": first, "docs": {f"k{i}": i for i in range(3000)}})
    ckpt = store.save("r", {"messages": Append([{"i": 80}]), "docs": Merge({"k7": "seven"})})
    assert ckpt.state["messages"][-1] == {"i": 80} and len(ckpt.state["messages"]) == 81
    latest = store.latest("r")
    assert latest is not None
    assert latest.state["messages"] == [*first, {"i": 80}]
    assert latest.state["docs"]["k7"] == "seven" and len(latest.state["docs"]) == 3000
    assert store.history("r", limit=1)[0].added < 40_000  # the open chunks, not the values
    store.save("new", {"log": Append([1, 2])})
    assert store.latest("new").state["log"] == [1, 2]  # type: ignore[union-attr]


def test_corrupt_chunk_is_detected_and_named(store: Store) -> None:
    _grow(store, "conv", 40)
    head = store.latest("conv")
    assert head is not None
    key = next(k for k in _chunk_keys(store, head.id) if is_chunk_key(k))

    def rot(tx: Any) -> None:
        data = bytes(tx.one("SELECT data FROM pitstop_blobs WHERE hash = ?", (key,))[0])
        if not data:  # an alias: rot its target
            target = tx.one("SELECT alias FROM pitstop_blobs WHERE hash = ?", (key,))[0]
            data = bytes(tx.one("SELECT data FROM pitstop_blobs WHERE hash = ?", (target,))[0])
            tx.run("UPDATE pitstop_blobs SET data = ? WHERE hash = ?",
                   (data[:-2] + b"!!", target))
            return
        bad = data[:10] + b"?" + data[11:]
        tx.run("UPDATE pitstop_blobs SET data = ? WHERE hash = ?", (bad, key))

    store._tx(rot, write=True)  # type: ignore[attr-defined]
    with pytest.raises(CorruptCheckpointError) as info:
        store.latest("conv")
    assert info.value.field == "messages" and info.value.run_id == "conv"
    assert info.value.checkpoint_id == head.id
    problems = store.verify()
    assert any(p.kind == "blob" for p in problems), problems


def test_a_chunk_key_held_by_other_bytes_is_refused(store: Store) -> None:
    """Chunk keys are xxh3-128, which a crafted value can collide with: a new chunk whose
    key a stored chunk with other bytes holds is refused, naming the run and the field, and
    nothing is written (the stored chunk is not taken for the new one)."""
    rng = random.Random(11)
    msgs = [_message(rng, i) for i in range(60)]
    extra = _message(rng, 60)
    # Another run makes the very chunks the next save will need; their rows are then given
    # other bytes, as if a colliding value had been stored under those keys first.
    store.save("other", {"messages": msgs})
    before = set(_all_chunk_keys(store))
    store.save("other", {"messages": [*msgs, extra]})
    planted = set(_all_chunk_keys(store)) - before
    assert planted

    def plant(tx: Any) -> None:
        for key in planted:
            tx.run("UPDATE pitstop_blobs SET data = ? WHERE hash = ?", (b"\x00" + b"x" * 40, key))

    store.save("victim", {"messages": msgs})
    head = store.latest("victim")
    store._tx(plant, write=True)  # type: ignore[attr-defined]
    with pytest.raises(pitstop.StoreError) as info:
        store.save("victim", {"messages": [*msgs, extra]})
    message = str(info.value)
    assert "'victim'" in message and "'messages'" in message and "collision" in message
    latest = store.latest("victim")
    assert latest is not None and head is not None and latest.id == head.id
    assert latest.state["messages"] == msgs

    # Stored as a prefix of another chunk (rows a SQLite store or an import makes): the
    # bytes it stands for are compared too.
    store.save("spare", {"messages": [_message(rng, i) for i in range(100, 180)]})
    other = sorted(set(_all_chunk_keys(store)) - planted)[0]

    def plant_prefix(tx: Any) -> None:
        for key in planted:
            tx.run("UPDATE pitstop_blobs SET data = ?, alias = ?, size = ? WHERE hash = ?",
                   (b"", other, 20, key))

    store._tx(plant_prefix, write=True)  # type: ignore[attr-defined]
    with pytest.raises(pitstop.StoreError, match="collision"):
        store.save("victim", {"messages": [*msgs, extra]})
    assert store.latest("victim").id == head.id  # type: ignore[union-attr]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_grown_list_saves_without_a_collision_query_on_sqlite(store: Store) -> None:
    """SQLite reports how many rows an INSERT added: the collision check (above) runs only
    when a new chunk's key was stored already, not as one more statement in every save."""
    rng = random.Random(12)
    msgs = [_message(rng, i) for i in range(60)]
    store.save("conv", {"messages": msgs})
    statements: list[str] = []
    conn = store._connection()  # type: ignore[attr-defined]
    conn.set_trace_callback(statements.append)
    try:
        msgs.append(_message(rng, 60))
        store.save("conv", {"messages": pitstop.Append([msgs[-1]])})
        msgs.append(_message(rng, 61))
        store.save("conv", {"messages": msgs})
    finally:
        conn.set_trace_callback(None)
    assert statements
    assert not [q for q in statements if q.startswith("SELECT hash FROM pitstop_blobs")]
    assert store.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    assert store.verify() == []


def _all_chunk_keys(store: Store) -> list[bytes]:
    rows = store._tx(lambda tx: tx.all("SELECT hash FROM pitstop_blobs"))  # type: ignore[attr-defined]
    return [bytes(h) for (h,) in rows if is_chunk_key(bytes(h))]


def test_prune_and_forks_never_lose_a_referenced_chunk(store: Store) -> None:
    msgs = _grow(store, "conv", 70)
    middle = store.history("conv", limit=None)[35]
    fork = store.fork(middle.id, new_run_id="fork")
    store.save("fork", {"messages": [*fork.state["messages"], {"fork": True}], "turn": -1})
    report = store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
    assert report.checkpoints
    assert store.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    store.delete_run("conv")
    forked = store.latest("fork")
    assert forked is not None and forked.state["messages"][-1] == {"fork": True}
    assert forked.state["messages"][:-1] == msgs[: middle.step + 1]
    assert store.verify() == []
    store.delete_run("fork")
    assert store.stats().blobs == 0  # nothing left behind once nothing references it


def test_export_import_carries_chunked_values(open_store: Any) -> None:
    source = open_store()
    msgs = _grow(source, "conv", 50)
    data = source.export_run("conv")
    target = pitstop.open_store("memory://")
    try:
        target.import_run(data)
        assert target.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
        assert target.verify() == []
    finally:
        target.close()


@pytest.mark.slow
def test_an_archive_carries_each_chunk_once(open_store: Any, tmp_path: Any) -> None:
    """A growing list's superseded last chunks (stored as prefixes of the chunks extending
    them) travel as prefixes, not as copies: the archive is about the list's size, and the
    import stores them as prefixes again, every checkpoint intact."""
    from pitstop.archive import import_archive, read_archive, write_archive

    source = open_store()
    msgs = _grow(source, "conv", 150)
    final = len(pitstop.MsgpackSerializer().dumps(msgs))
    info = write_archive(source, "conv", tmp_path / "conv.pitstop")
    assert info.bytes < 1.3 * final  # random letters: zstd keeps ~3/4 of them
    _, data = read_archive(tmp_path / "conv.pitstop")
    if source.url.startswith(("sqlite", "memory")):  # PostgreSQL seals instead (no prefixes)
        assert data.prefixes
    carried = sum(len(v) for k, v in data.blobs.items() if k not in data.prefixes)
    assert carried < 1.3 * final  # each chunk's bytes once (zstd would hide copies)
    for name in ("copy", "renamed"):
        target = pitstop.open_store(f"sqlite:///{tmp_path / name}.db")
        try:
            import_archive(target, data, run_id=None if name == "copy" else "conv-2")
            run_id = "conv" if name == "copy" else "conv-2"
            for summary in target.history(run_id, limit=None)[::11]:
                ckpt = target.get(summary.id)
                assert ckpt.state["messages"] == msgs[: ckpt.state["turn"] + 1]
            assert target.verify() == []
            assert target.stats().bytes < 1.5 * final
            aliases = target._tx(  # type: ignore[attr-defined]
                lambda tx: tx.one("SELECT COUNT(*) FROM pitstop_blobs WHERE alias IS NOT NULL")
            )[0]
            assert aliases == len(data.prefixes)
        finally:
            target.close()


def test_large_buffers_are_chunked(store: Store) -> None:
    import numpy as np

    array = np.arange(600_000, dtype=np.float32)
    store.save("a", {"w": array, "b": b"x" * 300_000})
    array[1000:2000] = -1
    store.save("a", {"w": array, "b": b"x" * 300_000})
    assert store.history("a", limit=1)[0].added < 1_200_000  # one 1 MiB chunk of 2.4 MiB
    back = store.latest("a")
    assert back is not None and np.array_equal(back.state["w"], array)
    assert back.state["b"] == b"x" * 300_000


# -- crashes and concurrent garbage collection ----------------------------------------------------


GROWER = """
import random, string, sys
import pitstop
store = pitstop.open_store(sys.argv[1])
latest = store.latest("conv")
msgs = latest.state["messages"] if latest is not None else []
while True:
    i = len(msgs)
    rng = random.Random(i)
    text = "".join(rng.choices(string.ascii_letters, k=rng.randint(10, 9000)))
    msgs.append({"i": i, "text": text})
    if i % 7 == 3:
        msgs[i // 2]["edited"] = i  # an in-place edit of an earlier item, now and then
    store.save("conv", {"messages": msgs}, metadata={"n": len(msgs)})
    print(i, flush=True)
"""


def _expected(n: int) -> list[dict[str, Any]]:
    import random as rnd

    msgs: list[dict[str, Any]] = []
    for i in range(n):
        rng = rnd.Random(i)
        k = rng.randint(10, 9000)
        msgs.append({"i": i, "text": "".join(rng.choices(string.ascii_letters, k=k))})
        if i % 7 == 3:
            msgs[i // 2]["edited"] = i
    return msgs


@pytest.mark.slow
def test_sigkill_during_chunked_saves_leaves_the_previous_checkpoint_intact(
    shared_url: str,
) -> None:
    rng = random.Random(7)
    seen = 0
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", GROWER, shared_url], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        # Wait (generously: the machine may be loaded) until it is saving, then kill it at a
        # random moment of a later save.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if proc.stdout.readline().strip():
                break
        time.sleep(rng.uniform(0.0, 0.4))
        proc.kill()
        proc.wait()
        with pitstop.open_store(shared_url) as store:
            latest = store.latest("conv")
            assert latest is not None
            n = latest.metadata["n"]
            assert n >= seen  # never goes backwards
            assert latest.state["messages"] == _expected(n)
            seen = n
    assert seen > 8
    with pitstop.open_store(shared_url) as store:
        problems = store.verify()
        # A crash may leave an unreferenced blob-store file, never a broken record or chunk.
        assert [p for p in problems if "references" not in p.message] == []


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_postgres_grows_a_list_by_inserts_alone(open_store: Any) -> None:
    """On PostgreSQL an UPDATE leaves the old row version behind until a vacuum, so a grown
    list's last chunk is sealed, not rewritten: saves insert rows and never change one, and
    each message is stored about once."""
    store = open_store()

    def versions(tx: Any) -> dict[bytes, str]:
        rows = tx.all("SELECT hash, xmin::text FROM pitstop_blobs")
        return {bytes(h): x for h, x in rows}

    msgs = _grow(store, "conv", 40)
    before = store._tx(versions)  # type: ignore[attr-defined]
    rng = random.Random(9)
    for i in range(40, 80):
        msgs.append(_message(rng, i))
        store.save("conv", {"messages": msgs, "turn": i})  # the whole list
    for i in range(80, 100):
        extra = _message(rng, i)
        msgs.append(extra)
        store.save("conv", {"messages": Append([extra]), "turn": i})
    after = store._tx(versions)  # type: ignore[attr-defined]
    assert {h: after.get(h) for h in before} == before  # no row rewritten (same xmin)
    aliases = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.one("SELECT COUNT(*) FROM pitstop_blobs WHERE alias IS NOT NULL")[0]
    )
    assert aliases == 0
    stored = store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.one("SELECT SUM(size) FROM pitstop_blobs")[0]
    )
    final = len(pitstop.MsgpackSerializer().dumps(msgs))
    assert stored < 1.4 * final  # each message about once (plus index nodes)
    assert store.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
    for summary in store.history("conv", limit=None)[::13]:
        ckpt = store.get(summary.id)
        assert ckpt.state["messages"] == msgs[: ckpt.state["turn"] + 1]
    assert store.verify() == []


@pytest.mark.postgres
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.slow
def test_gc_never_deletes_a_chunk_a_concurrent_save_references(open_store: Any) -> None:
    rng = random.Random(3)
    main = open_store()
    msgs = _grow(main, "conv", 60)
    errors: list[BaseException] = []
    stop = threading.Event()

    def prune() -> None:
        store = open_store()
        try:
            while not stop.is_set():
                store.prune(pitstop.RetentionPolicy(keep_last=1, keep_milestones=False))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    made: list[str] = []

    def grow_forks() -> None:
        store = open_store()
        try:
            for n in range(25):
                try:
                    head = store.latest("conv")
                    assert head is not None
                    fork = store.fork(head.id, new_run_id=f"fork-{n}")
                except pitstop.CheckpointNotFoundError:
                    continue  # pruned between reading the head and forking it: refused, fine
                grown = [*fork.state["messages"], _message(rng, 1000 + n)]
                store.save(f"fork-{n}", {"messages": grown, "turn": n})
                latest = store.latest(f"fork-{n}")
                assert latest is not None
                assert latest.state["messages"] == grown
                made.append(f"fork-{n}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    pruner = threading.Thread(target=prune)
    growers = [threading.Thread(target=grow_forks)]
    pruner.start()
    for t in growers:
        t.start()
    for i in range(40):  # the source keeps growing (and its old chunks become aliases)
        msgs.append(_message(rng, 100 + i))
        main.save("conv", {"messages": msgs, "turn": 100 + i})
    for t in growers:
        t.join()
    stop.set()
    pruner.join()
    assert errors == []
    assert main.verify() == []
    assert len(made) > 5
    for run_id in made:
        assert main.latest(run_id) is not None
    assert main.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]


def test_a_store_from_before_chunks_is_upgraded_and_keeps_its_values(tmp_path: Any) -> None:
    from oldstore import write_old
    from pitstop.store.engine import schema as sqlmod

    url = f"sqlite:///{tmp_path / 'old.db'}"
    rng = random.Random(9)
    msgs = [_message(rng, i, 500) for i in range(10)]  # small: one ordinary value
    first = write_old(url, sqlmod.MIGRATIONS[0][0], lambda old: old.save(  # the first release
        "conv", {"messages": list(msgs)}
    ))
    with pitstop.open_store(url) as new:
        assert new.schema_version() == sqlmod.LATEST_SCHEMA  # type: ignore[attr-defined]
        for i in range(10, 120):
            msgs.append(_message(rng, i))
            new.save("conv", {"messages": msgs})
        assert new.get(first.id).state["messages"] == msgs[:10]
        assert new.latest("conv").state["messages"] == msgs  # type: ignore[union-attr]
        head = new.history("conv", limit=1)[0]
        assert head.added < 4096
        assert new.verify() == []


def test_large_chunks_go_to_the_blob_directory(tmp_path: Any) -> None:
    import numpy as np

    blobs = tmp_path / "blobs"
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with pitstop.open_store(url, blobs=str(blobs), blob_threshold=512 * 1024) as store:
        array = np.arange(3 * (1 << 20) // 4, dtype=np.float32)  # 3 chunks of 1 MiB
        store.save("a", {"w": array})
        (pack,) = set(blobs.rglob("*.pack"))  # the three chunks one save adds: one file
        assert not set(blobs.rglob("*.blob"))
        array[10] = -1
        store.save("a", {"w": array})
        (changed,) = set(blobs.rglob("*.blob"))  # one chunk changed: one file added
        assert store.verify() == []
        store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
        # The replaced chunk's row is gone; its pack stays, holding the other two.
        assert set(blobs.rglob("*.pack")) == {pack} and set(blobs.rglob("*.blob")) == {changed}
        array[20:] = -2
        store.save("a", {"w": array})
        store.prune(RetentionPolicy(keep_last=1, keep_milestones=False))
        # Its last chunks replaced: the pack is gone (the new save's pack holds all three).
        assert pack not in set(blobs.rglob("*.pack")) and not set(blobs.rglob("*.blob"))
        assert store.verify() == []
        back = store.latest("a")
        assert back is not None and np.array_equal(back.state["w"], array)


def _lines_run_by_one_step(store: Store, run_id: str, items: int) -> int:
    """Python lines run between step 3 and step 4 of a workflow whose state starts with a
    list of ``items`` 2 KiB messages and whose steps each return ``Append([message])``: the
    save of one step (and the start of the next), counted, not timed. (The list's open last
    chunk, at most 64 KiB, is serialised again: a few dozen items at most, whatever the
    length.)"""
    rng = random.Random(items)
    start = [_message(rng, i) for i in range(items)]
    wf = pitstop.Workflow(f"append-{items}", durability="normal")
    counted: list[int] = []
    lines = 0

    def count(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return count

    @wf.step
    def talk(state: dict[str, Any]) -> Any:
        turn = state["turn"]
        if turn == 4:
            sys.settrace(None)
            counted.append(lines)
            return pitstop.finish({"turn": turn})
        update = {"messages": Append([_message(rng, items + turn)]), "turn": turn + 1}
        if turn == 3:
            sys.settrace(count)
        return pitstop.goto("talk", update)

    try:
        result = wf.start(store, {"messages": start, "turn": 0}, run_id=run_id)
        assert result.status is pitstop.RunStatus.COMPLETED
    finally:
        sys.settrace(None)
    return counted[0]


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.slow
def test_an_append_step_costs_the_same_however_long_the_list_when_arrays_are_possible(
    store: Store, library: str
) -> None:
    """With numpy or torch imported any value could hold an array, but a step that appends
    to a long list must not look at the items it did not add (it once walked the whole
    state for tensors on every step: O(state), 0.3 -> 2-6 ms a step by turn 10,000)."""
    pytest.importorskip(library)
    short = _lines_run_by_one_step(store, "short", 200)
    long = _lines_run_by_one_step(store, "long", 4_000)
    # The open chunk differs by a few hundred lines; before the fix: + ~72,000 (every item).
    assert long <= short + 1_000, (short, long)
