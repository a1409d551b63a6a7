"""Encryption at rest of the records a sealed store keeps in the database: inputs, effects'
results and writes attached to checkpoints (LangGraph's pending writes), on SQLite and
PostgreSQL. Each is sealed with AES-256-GCM under a keyed content address; the raw rows
are read back to check that no plaintext and no plain hash is left in them."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest

import pitstop
from pitstop import CorruptCheckpointError, Encryption, EncryptionKeyError, RunStatus

pytest.importorskip("cryptography")

from pitstop.serde import digest, unframe
from pitstop.store.encoding.attached import read_frames
from pitstop.store.encoding.sealed import is_sealed, key_id_of
from pitstop.store.engine.rekey import rekey

K1, K2 = os.urandom(32), os.urandom(32)
SECRET = "card 4111-1111-1111-1111, typed by the user"


class Graph(TypedDict, total=False):
    """The LangGraph test's state (at module level: LangGraph reads its annotations)."""

    log: list[str]
    other: str


def ring(*ids: str) -> Encryption:
    every = {"k1": K1, "k2": K2}
    return Encryption(keys={i: every[i] for i in ids}, current=ids[0])


@pytest.fixture
def opener(open_shared: Callable[..., pitstop.Store], tmp_path: Path
           ) -> Callable[..., pitstop.Store]:
    return functools.partial(open_shared, blobs=str(tmp_path / "blobs"))


def raw_records(store: pitstop.Store) -> list[tuple[bytes, bytes]]:
    """(value, content key) of every input, effect and attached write, as stored."""
    def read(tx: Any) -> list[tuple[bytes, bytes]]:
        out = [(bytes(v), bytes(h)) for v, h in tx.all(
            "SELECT payload, hash FROM pitstop_inputs")]
        out += [(bytes(v), bytes(h)) for v, h in tx.all(
            "SELECT result, hash FROM pitstop_effects")]
        for (writes,) in tx.all(
                "SELECT writes FROM pitstop_checkpoints WHERE writes IS NOT NULL"):
            out += [(value, h) for _, value, h, _ in read_frames(bytes(writes))]
        return out

    return store._tx(read)  # type: ignore[attr-defined, no-any-return]


def fill(store: pitstop.Store, run_id: str = "r") -> str:
    """An input, two effects holding equal values and an attached write, all with SECRET."""
    saved = store.save(run_id, {"n": 1}, status=RunStatus.WAITING,
                       metadata={"waiting_for": ["card"]})
    store.send(run_id, "card", {"card": SECRET})
    store.record_effects(run_id, {"charge": SECRET, "again": SECRET})
    store.attach(run_id, saved.id, {"write": [SECRET, 1]})
    return saved.id


def check(store: pitstop.Store, checkpoint_id: str, run_id: str = "r") -> None:
    assert store.inputs(run_id)["card"].payload == {"card": SECRET}
    assert store.effects(run_id) == {"charge": SECRET, "again": SECRET}
    assert store.attachments(run_id, checkpoint_id) == {"write": [SECRET, 1]}


def test_records_are_sealed_under_a_keyed_address_and_read_back(
    opener: Callable[..., pitstop.Store],
) -> None:
    store = opener(encryption=ring("k1"))
    checkpoint_id = fill(store)
    check(store, checkpoint_id)
    with opener(encryption=ring("k1")) as fresh:  # another handle, the same ring
        check(fresh, checkpoint_id)
    records = raw_records(store)
    assert len(records) == 4
    for value, _ in records:
        assert is_sealed(value) and key_id_of(value) == "k1"
        assert SECRET.encode() not in value
    # equal values share a keyed address (dedup keeps working), not their plain hash
    effects = {bytes(h) for (h,) in store._tx(  # type: ignore[attr-defined]
        lambda tx: tx.all("SELECT hash FROM pitstop_effects"))}
    assert len(effects) == 1
    fmt = store.serializer.format_id
    assert effects != {digest(fmt, store.serializer.dumps(SECRET))}


def test_a_plain_store_is_unchanged() -> None:
    """Without encryption: plain frames under their SHA-256, as before."""
    with pitstop.open_store("memory://") as store:
        checkpoint_id = fill(store)
        check(store, checkpoint_id)
        for value, key in raw_records(store):
            assert not is_sealed(value) and key == digest(*unframe(value))


def test_wrong_or_missing_key_is_named_and_runs_still_list(
    opener: Callable[..., pitstop.Store],
) -> None:
    fill(opener(encryption=ring("k1")))
    with opener(encryption=ring("k2")) as wrong:
        with pytest.raises(EncryptionKeyError, match="'k1'") as info:
            wrong.effects("r")
        assert info.value.key_id == "k1"
        with pytest.raises(EncryptionKeyError, match="'k1'"):
            wrong.inputs("r")
    with opener() as plain:  # no keys: metadata lists, sealed records are refused
        assert [run.id for run in plain.runs()] == ["r"]
        # The state is sealed too: refused, naming the run and checkpoint.
        with pytest.raises(EncryptionKeyError, match=r"run 'r': checkpoint \S+: .*'k1'"):
            plain.latest("r")
        with pytest.raises(EncryptionKeyError, match=r"sealed .* with key 'k1'"):
            plain.effects("r")


def test_a_tampered_record_is_corruption(opener: Callable[..., pitstop.Store]) -> None:
    store = opener(encryption=ring("k1"))
    fill(store)

    def flip(tx: Any) -> None:
        value = bytes(tx.one("SELECT result FROM pitstop_effects WHERE key = 'charge'")[0])
        altered = value[:-20] + bytes([value[-20] ^ 1]) + value[-19:]
        tx.run("UPDATE pitstop_effects SET result = ? WHERE key = 'charge'", (altered,))

    store._tx(flip, write=True)  # type: ignore[attr-defined]
    with pytest.raises(CorruptCheckpointError, match="fails authentication under key 'k1'"):
        store.effects("r")

    def swap(tx: Any) -> None:  # a sealed value moved to another record's place
        payload = bytes(tx.one("SELECT payload FROM pitstop_inputs")[0])
        tx.run("UPDATE pitstop_effects SET result = ? WHERE key = 'charge'", (payload,))

    store._tx(swap, write=True)  # type: ignore[attr-defined]
    with pytest.raises(CorruptCheckpointError, match="fails authentication"):
        store.effects("r")


def test_rekey_seals_records_again_and_the_old_key_can_go(
    opener: Callable[..., pitstop.Store],
) -> None:
    before = opener()  # records written before the store was sealed
    plain_checkpoint = fill(before, "old")
    before.close()
    store = opener(encryption=ring("k1"))
    sealed_checkpoint = fill(store, "new")
    store.close()
    store = opener(encryption=ring("k2", "k1"))
    assert rekey(store, "k2") == 10  # records: 4 plain, 4 under k1; a state value each
    assert rekey(store, "k2") == 0
    records = raw_records(store)
    assert all(is_sealed(v) and key_id_of(v) == "k2" for v, _ in records)
    assert all(SECRET.encode() not in v for v, _ in records)
    with opener(encryption=ring("k2")) as without_k1:
        check(without_k1, plain_checkpoint, "old")
        check(without_k1, sealed_checkpoint, "new")
        assert without_k1.verify() == []


def test_langgraph_pending_writes_are_sealed(opener: Callable[..., pitstop.Store]) -> None:
    """A graph interrupted on a sealed store: its pending writes (the interrupt and a
    node's output, attached to the checkpoint) are ciphertext in the row; it resumes."""
    pytest.importorskip("langgraph")
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Command, interrupt

    from pitstop.integrations.langgraph import PitstopSaver

    def build(saver: PitstopSaver) -> Any:
        def ask(state: dict[str, Any]) -> dict[str, Any]:
            return {"log": [*state.get("log", []), interrupt(SECRET)]}

        def side(state: dict[str, Any]) -> dict[str, Any]:
            return {"other": SECRET}

        builder: Any = StateGraph(Graph)
        builder.add_node("ask", ask)
        builder.add_node("side", side)
        builder.add_edge(START, "ask")
        builder.add_edge(START, "side")
        builder.add_edge("ask", END)
        builder.add_edge("side", END)
        return builder.compile(checkpointer=saver)

    cfg: Any = {"configurable": {"thread_id": "t"}}
    store = opener(encryption=ring("k1"))
    build(PitstopSaver(store)).invoke({"log": []}, cfg)
    records = raw_records(store)
    assert records and all(is_sealed(v) for v, _ in records)
    assert all(SECRET.encode() not in v for v, _ in records)
    with opener(encryption=ring("k1")) as fresh:
        out = build(PitstopSaver(fresh)).invoke(Command(resume="ok"), cfg)
        assert out["log"] == ["ok"]


@pytest.mark.parametrize("stream", [False, True])
def test_export_opens_records_and_import_seals_them_again(
    opener: Callable[..., pitstop.Store], tmp_path: Path, stream: bool
) -> None:
    source = opener(encryption=ring("k1"))
    checkpoint_id = fill(source)
    data = source.export_run("r", stream=stream)
    with pitstop.open_store(f"sqlite:///{tmp_path / 'plain.db'}") as plain:
        plain.import_run(data)  # an archive is portable: plain records, under SHA-256
        check(plain, checkpoint_id)
        assert all(not is_sealed(v) and k == digest(*unframe(v)) for v, k in raw_records(plain))
    with pitstop.open_store(f"sqlite:///{tmp_path / 'sealed.db'}", blobs=str(tmp_path / "b2"),
                            encryption=ring("k2")) as sealed:
        sealed.import_run(data)
        check(sealed, checkpoint_id)
        records = raw_records(sealed)
        assert len(records) == 4
        assert all(is_sealed(v) and key_id_of(v) == "k2" for v, _ in records)
        assert sealed.verify() == []
