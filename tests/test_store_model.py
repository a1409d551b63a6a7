"""Model-based test of the store contract: random sequences of saves, branches, forks,
deletes and prunes, checked after every step against a plain-dict model of what the store
should hold — on every backend.
"""

from __future__ import annotations

import uuid
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import pitstop
from conftest import BACKENDS, drop_pg_schema, pg_schema_url
from pitstop import RetentionPolicy
from pitstop.serde import MsgpackSerializer, digest
from pitstop.store.encoding.records import INLINE_MAX

RUNS = ["a", "b", "c"]
FIELDS = ["messages", "plan", "count", "blob"]

values = st.one_of(
    st.integers(-5, 5),
    st.text(max_size=3),
    st.lists(st.integers(0, 3), max_size=3),
    st.sampled_from(["x" * 60, "y" * 60, "z" * 200]),  # shared, stored (not inline) values
    st.binary(min_size=40, max_size=60),
)
states = st.dictionaries(st.sampled_from(FIELDS), values, max_size=4)

_serializer = MsgpackSerializer()


def stored_key(value: Any) -> bytes | None:
    """The content hash a value is stored under, or None if it lives inline in a record."""
    raw = _serializer.dumps(value)
    return None if len(raw) < INLINE_MAX else digest(0, raw)


class StoreModel(RuleBasedStateMachine):
    checkpoints = Bundle("checkpoints")

    def __init__(self) -> None:
        super().__init__()
        self.store: pitstop.Store | None = None
        self.schema: str | None = None
        # model: checkpoint id -> (run, parent, state, tagged); run -> head id
        self.model: dict[str, tuple[str, str | None, dict[str, Any], bool]] = {}
        self.heads: dict[str, str] = {}

    @initialize()
    def open(self) -> None:
        backend = self.backend  # type: ignore[attr-defined]
        if backend == "sqlite":
            url = f"sqlite:///{self.tmpdir}/model-{uuid.uuid4().hex}.db"  # type: ignore[attr-defined]
        elif backend == "memory":
            url = "memory://"
        else:
            self.schema = f"m_{uuid.uuid4().hex[:10]}"
            url = pg_schema_url(self.schema)
        self.store = pitstop.open_store(url)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.schema:
            drop_pg_schema(self.schema)

    @property
    def s(self) -> pitstop.Store:
        assert self.store is not None
        return self.store

    def _ids_of(self, run: str) -> list[str]:
        return sorted((i for i, m in self.model.items() if m[0] == run), reverse=True)

    # -- rules ---------------------------------------------------------------------------------

    @rule(target=checkpoints, run=st.sampled_from(RUNS), state=states,
          hint=st.booleans(), tag=st.booleans())
    def save(self, run: str, state: dict[str, Any], hint: bool, tag: bool) -> str:
        parent = self.heads.get(run)
        changed = None
        if hint and parent is not None:
            before = self.model[parent][2]
            changed = [k for k in state if k not in before or before[k] != state[k]
                       or type(before[k]) is not type(state[k])]
        ckpt = self.s.save(run, state, changed=changed,
                           metadata={"tags": ["m"]} if tag else None)
        assert ckpt.parent_id == parent
        self.model[ckpt.id] = (run, parent, dict(state), tag)
        self.heads[run] = ckpt.id
        return ckpt.id

    @rule(target=checkpoints, source=checkpoints, state=states)
    def branch(self, source: str, state: dict[str, Any]) -> str:
        if source not in self.model:
            return source  # deleted meanwhile; nothing to do
        run = self.model[source][0]
        ckpt = self.s.save(run, state, parent_id=source)
        self.model[ckpt.id] = (run, source, dict(state), False)
        self.heads[run] = ckpt.id
        return ckpt.id

    @rule(target=checkpoints, source=checkpoints, update=states)
    def fork(self, source: str, update: dict[str, Any]) -> str:
        if source not in self.model:
            return source
        run_id = f"fork-{len(self.heads)}-{uuid.uuid4().hex[:6]}"
        ckpt = self.s.fork(source, new_run_id=run_id, update=update)
        state = {**self.model[source][2], **update}
        assert ckpt.state == state
        self.model[ckpt.id] = (run_id, source, state, False)
        self.heads[run_id] = ckpt.id
        return ckpt.id

    @precondition(lambda self: bool(self.heads))
    @rule(data=st.data())
    def delete_run(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(sorted(self.heads)))
        report = self.s.delete_run(run)
        assert sorted(report.checkpoints) == sorted(self._ids_of(run))
        for ckpt_id in self._ids_of(run):
            del self.model[ckpt_id]
        del self.heads[run]

    @precondition(lambda self: bool(self.heads))
    @rule(keep=st.integers(1, 3), milestones=st.booleans(), data=st.data(), dry=st.booleans())
    def prune(self, keep: int, milestones: bool, data: st.DataObject, dry: bool) -> None:
        run = data.draw(st.sampled_from([None, *sorted(self.heads)]))
        policy = RetentionPolicy(keep_last=keep, keep_milestones=milestones)
        report = self.s.prune(policy, run_id=run, dry_run=dry)
        expected: list[str] = []
        for r in [run] if run else list(self.heads):
            ids = self._ids_of(r)
            kept = set(ids[:keep]) | {self.heads[r]}
            if milestones:
                kept |= {i for i in ids if self.model[i][3]}
            expected += [i for i in ids if i not in kept]
        assert sorted(report.checkpoints) == sorted(expected)
        if not dry:
            for ckpt_id in expected:
                del self.model[ckpt_id]

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def heads_and_histories_match(self) -> None:
        if self.store is None:
            return
        for run, head in self.heads.items():
            latest = self.s.latest(run)
            assert latest is not None and latest.id == head
            assert latest.state == self.model[head][2]
            assert [h.id for h in self.s.history(run, limit=None)] == self._ids_of(run)

    @invariant()
    def every_checkpoint_reads_back(self) -> None:
        if self.store is None:
            return
        for ckpt_id, (run, parent, state, _) in self.model.items():
            got = self.s.get(ckpt_id)
            assert (got.run_id, got.parent_id, got.state) == (run, parent, state)

    @invariant()
    def values_are_stored_once_and_collected(self) -> None:
        if self.store is None:
            return
        referenced = {
            key
            for _, _, state, _ in self.model.values()
            for value in state.values()
            if (key := stored_key(value)) is not None
        }
        stats = self.s.stats()
        assert stats.blobs == len(referenced)  # no duplicates, no leaks, nothing missing
        assert stats.checkpoints == len(self.model)
        assert stats.runs == len(self.heads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_store_behaves_like_its_model(backend: str, tmp_path: Any) -> None:
    examples = 12 if backend == "postgres" else 40

    class Machine(StoreModel):
        pass

    Machine.backend = backend  # type: ignore[attr-defined]
    Machine.tmpdir = str(tmp_path)  # type: ignore[attr-defined]
    Machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    Machine.TestCase().runTest()
