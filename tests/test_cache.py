"""Results cached across runs (#28): CachePolicy steps and ctx.cached, on every backend."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import pitstop
from clitools import one_error_line, pitstop_exe
from pitstop import CacheKeyError, CachePolicy, RetentionPolicy, Store


def counting_workflow(name: str, calls: list[Any], **policy: Any) -> pitstop.Workflow:
    wf = pitstop.Workflow(name)

    @wf.step(cache=CachePolicy(inputs=["url", "params"], **policy))
    def fetch(state: dict[str, Any]) -> dict[str, Any]:
        calls.append((state["url"], state.get("params")))
        return {"html": f"<p>{state['url']}</p>" * 3, "pages": list(range(2000))}

    @wf.step
    def summarize(state: dict[str, Any]) -> dict[str, Any]:
        return {"length": len(state["html"])}

    return wf


def test_a_step_is_served_from_another_runs_result(store: Store) -> None:
    calls: list[Any] = []
    wf = counting_workflow("fetcher", calls)
    first = wf.start(store, {"url": "a", "params": {"x": 1, "y": 2}})
    # Equal values in another order, an undeclared field changed: the same key.
    again = wf.start(store, {"url": "a", "params": {"y": 2, "x": 1}, "noise": 7})
    assert calls == [("a", {"x": 1, "y": 2})]
    assert again.state["html"] == first.state["html"]
    assert again.state["pages"] == list(range(2000))
    assert again.state["length"] == first.state["length"]
    served = [c.metadata.get("cached") for c in store.history(again.run_id)]
    assert [{"step": "fetch", "run": first.run_id}] in served
    # A changed input is a miss.
    wf.start(store, {"url": "b", "params": {"x": 1, "y": 2}})
    assert len(calls) == 2
    entries = store.cache_entries(name="fetch")
    assert len(entries) == 2 and not any(e.computing for e in entries)
    assert store.stats().cache_entries == 2


def test_steps_served_from_the_cache_share_one_checkpoint(store: Store) -> None:
    calls: list[str] = []
    wf = pitstop.Workflow("chain")
    for index in range(5):
        def step(state: dict[str, Any], index: int = index) -> dict[str, Any]:
            calls.append(f"s{index}")
            return {f"out{index}": state.get(f"out{index - 1}", 0) + 1}

        def make(index: int) -> Any:
            def run(state: dict[str, Any]) -> dict[str, Any]:
                return step(state, index)
            return run

        wf.step(name=f"s{index}", cache=CachePolicy(inputs=["seed"], version="1"))(make(index))

    @wf.step
    def last(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("last")
        return {"done": state["out4"]}

    first = wf.start(store, {"seed": 1})
    again = wf.start(store, {"seed": 1})
    assert again.state == first.state and calls.count("s0") == 1 and calls.count("last") == 2
    # Five hits, then the step that ran: one checkpoint for all six, which says what the
    # cache served (a crash before it redoes five lookups, not five computations).
    checkpoints = store.history(again.run_id)
    assert len(checkpoints) < len(store.history(first.run_id)) - 4
    served = [c.metadata["cached"] for c in checkpoints if c.metadata.get("cached")]
    assert served == [[{"step": f"s{i}", "run": first.run_id} for i in range(5)]]
    # A rerun from a served step still finds where to start.
    rerun = wf.rerun(store, again.run_id, from_step="s3")
    assert rerun.state == first.state and calls.count("s3") == 1


def test_source_or_version_change_is_a_miss(store: Store) -> None:
    calls: list[str] = []

    def build(version: str | None, body: int) -> pitstop.Workflow:
        wf = pitstop.Workflow("versions")
        if body == 1:
            @wf.step(cache=CachePolicy(inputs=["n"], version=version))
            def compute(state: dict[str, Any]) -> dict[str, Any]:
                calls.append("one")
                return {"out": state["n"] + 1}
        else:
            @wf.step(cache=CachePolicy(inputs=["n"], version=version))
            def compute(state: dict[str, Any]) -> dict[str, Any]:
                calls.append("two")
                return {"out": state["n"] + 2}
        return wf

    build(None, 1).start(store, {"n": 1})
    build(None, 1).start(store, {"n": 1})
    assert calls == ["one"]
    assert build(None, 2).start(store, {"n": 1}).state["out"] == 3  # other source
    assert calls == ["one", "two"]
    build("v1", 1).start(store, {"n": 1})
    build("v1", 2).start(store, {"n": 1})  # same version= : the source is not looked at
    build("v2", 1).start(store, {"n": 1})
    assert calls == ["one", "two", "one", "one"]


def test_key_callable_and_goto_route_are_kept(store: Store) -> None:
    calls: list[int] = []
    wf = pitstop.Workflow("keyed")

    @wf.step(cache=CachePolicy(key=lambda state: state["n"] % 10))
    def decide(state: dict[str, Any]) -> Any:
        calls.append(state["n"])
        return pitstop.goto("last", {"picked": state["n"]})

    @wf.step
    def skipped(state: dict[str, Any]) -> dict[str, Any]:
        return {"skipped": True}

    @wf.step
    def last(state: dict[str, Any]) -> dict[str, Any]:
        return {"done": True}

    wf.start(store, {"n": 3})
    result = wf.start(store, {"n": 13})  # same key: 13 % 10 == 3
    assert calls == [3]
    assert result.state["picked"] == 3 and "skipped" not in result.state


@pytest.mark.slow
def test_ttl_expires_and_prune_and_clear_manage_the_cache(store: Store) -> None:
    calls: list[Any] = []
    wf = counting_workflow("expiring", calls, ttl=0.3)
    wf.start(store, {"url": "a"})
    wf.start(store, {"url": "a"})
    assert len(calls) == 1
    time.sleep(0.4)
    wf.start(store, {"url": "a"})
    assert len(calls) == 2
    time.sleep(0.4)
    report = store.prune(RetentionPolicy(keep_last=100))
    assert report.cache_entries == 1
    assert store.stats().cache_entries == 0
    forever = counting_workflow("kept", calls)
    forever.start(store, {"url": "z"})
    assert store.cache_clear(name="nope") == 0
    assert store.cache_clear(older_than=3600) == 0
    before = store.stats().blobs
    assert store.cache_clear(name="fetch") == 1
    assert store.stats().cache_entries == 0
    assert store.stats().blobs <= before
    store.verify()


def test_prune_of_a_run_deletes_the_expired_entries_it_computed(store: Store) -> None:
    calls: list[Any] = []
    short = counting_workflow("short", calls, ttl=0.3)
    one = short.start(store, {"url": "a"})
    other = short.start(store, {"url": "b"})
    kept = counting_workflow("kept-live", calls).start(store, {"url": "c"})
    time.sleep(0.4)
    policy = RetentionPolicy(keep_last=100)
    assert store.prune(policy, run_id=one.run_id, dry_run=True).cache_entries == 1
    assert store.prune(policy, run_id=one.run_id).cache_entries == 1
    left = {e.run_id for e in store.cache_entries()}
    assert left == {other.run_id, kept.run_id}  # another run's expired entry, a live one
    assert store.prune(policy, run_id=kept.run_id).cache_entries == 0
    assert not store.verify()


def test_cleared_values_held_by_a_checkpoint_stay(store: Store) -> None:
    calls: list[Any] = []
    wf = counting_workflow("shared-values", calls)
    run = wf.start(store, {"url": "a"})
    assert store.cache_clear() == 1
    assert store.get(run.checkpoint_id).state["pages"] == list(range(2000))  # type: ignore[arg-type]
    assert not store.verify()
    # And the other way round: deleting the run leaves the cached result whole.
    wf.start(store, {"url": "b"})
    other = wf.start(store, {"url": "c"})
    store.delete_run(other.run_id)
    again = wf.start(store, {"url": "c"})
    assert again.state["pages"] == list(range(2000))
    assert len(calls) == 3


def test_a_failed_computation_is_not_cached(store: Store) -> None:
    attempts: list[int] = []
    wf = pitstop.Workflow("flaky")

    @wf.step(cache=CachePolicy(inputs=["n"]), retry=pitstop.Retry(attempts=2, backoff=0.01))
    def flaky(state: dict[str, Any]) -> dict[str, Any]:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first try fails")
        return {"ok": True}

    assert wf.start(store, {"n": 1}).state["ok"]
    assert len(attempts) == 2
    assert [e.computing for e in store.cache_entries()] == [False]


def test_unhashable_input_names_the_step_and_field(store: Store) -> None:
    wf = pitstop.Workflow("unhashable")

    class Opaque:
        pass

    @wf.step
    def call(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"out": ctx.cached("render", lambda page: 1, Opaque())}

    with pytest.raises(CacheKeyError) as caught:
        wf.start(store, {"n": 1})
    assert caught.value.step == "call" and caught.value.field == "argument 0"
    assert "render" not in str(caught.value) or "argument 0" in str(caught.value)


def test_ctx_cached_sync_and_async(store: Store) -> None:
    rendered: list[str] = []

    def render(page: str, *, style: str = "plain") -> str:
        rendered.append(page)
        return f"{style}:{page.upper()}"

    wf = pitstop.Workflow("renderer")

    @wf.step
    def page(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        return {"html": ctx.cached("render", render, state["page"], ttl=3600, style="bold")}

    awf = pitstop.Workflow("arenderer")

    @awf.step
    async def apage(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        async def arender(text: str) -> str:
            rendered.append("async:" + text)
            return text[::-1]

        return {"html": await ctx.acached("arender", arender, state["page"])}

    assert wf.start(store, {"page": "x"}).state["html"] == "bold:X"
    second = wf.start(store, {"page": "x"})
    assert second.state["html"] == "bold:X"
    assert rendered == ["x"]
    notes = [c.metadata.get("cached") for c in store.history(second.run_id)]
    assert any(n and n[0]["call"] == "render" for n in notes)

    async def twice() -> list[Any]:
        return [(await awf.astart(store, {"page": "ab"})).state["html"] for _ in range(2)]

    assert asyncio.run(twice()) == ["ba", "ba"]
    assert rendered == ["x", "async:ab"]


@pytest.mark.slow
def test_single_flight_in_threads(store: Store) -> None:
    """Runs of several threads needing one key at once: the function runs once."""
    calls: list[int] = []
    gate = threading.Event()
    wf = pitstop.Workflow("flight")

    @wf.step(cache=CachePolicy(inputs=["key"]))
    def slow(state: dict[str, Any]) -> dict[str, Any]:
        calls.append(1)
        gate.wait(5)
        time.sleep(0.2)
        return {"value": 42}

    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(wf.start(store, {"key": "same"}).state["value"])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    gate.set()
    for t in threads:
        t.join(30)
    assert not errors
    assert results == [42] * 4
    assert len(calls) == 1


def test_a_dead_claim_is_taken_over(store: Store) -> None:
    assert store.cache_claim("k", "n", "dead-owner", lease=0.2) == "claimed"
    assert store.cache_claim("k", "n", "other", lease=5) == "busy"
    time.sleep(0.3)
    assert store.cache_claim("k", "n", "other", lease=5) == "claimed"
    store.cache_put("k", "n", {"value": 1}, owner="other")
    # The late owner's result does not replace the live one.
    store.cache_put("k", "n", {"value": 2}, owner="dead-owner")
    hit = store.cache_get("k")
    assert hit is not None and hit.values == {"value": 1}


@pytest.mark.slow
def test_cli_history_show_and_cache_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    calls: list[Any] = []
    wf = counting_workflow("shown", calls)
    with pitstop.open_store(url) as store:
        first = wf.start(store, {"url": "a"})
        second = wf.start(store, {"url": "a"})
    history = pitstop_exe("history", second.run_id, store=url)
    assert history.code == 0, history.err
    assert "cached: fetch (from run" in history.out
    as_json = pitstop_exe("history", second.run_id, "--json", store=url).json
    served = [(c["id"], c["cached"]) for c in as_json["checkpoints"] if c["cached"]]
    assert [cached for _, cached in served] == [[{"step": "fetch", "run": first.run_id}]]
    shown = pitstop_exe("show", second.run_id, "--checkpoint", served[0][0], store=url)
    assert shown.code == 0, shown.err
    assert "fetch (from run" in shown.out


# -- rerun from a named step ---------------------------------------------------------------


def pipeline(calls: list[str]) -> pitstop.Workflow:
    wf = pitstop.Workflow("pipeline")

    @wf.step
    def load(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("load")
        return {"rows": [1, 2, 3]}

    @wf.step(cache=CachePolicy(inputs=["rows"]))
    def clean(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("clean")
        return {"clean": [r * 10 for r in state["rows"]]}

    @wf.step(cache=CachePolicy(inputs=["clean", "style"]))
    def summarize(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("summarize")
        return {"summary": f"{state.get('style', 'short')}:{sum(state['clean'])}"}

    @wf.step(cache=CachePolicy(inputs=["summary"]))
    def publish(state: dict[str, Any]) -> dict[str, Any]:
        calls.append("publish")
        return {"published": state["summary"].upper()}

    return wf


def test_rerun_from_a_step_skips_before_and_serves_unchanged_after(store: Store) -> None:
    calls: list[str] = []
    wf = pipeline(calls)
    first = wf.start(store, {"style": "short"})
    assert calls == ["load", "clean", "summarize", "publish"]
    calls.clear()
    same = wf.rerun(store, first.run_id, from_step="clean")
    assert calls == []  # load not executed again; the rest served from the cache
    assert same.state == first.state and same.run_id != first.run_id
    calls.clear()
    edited = wf.rerun(store, first.run_id, from_step="summarize", update={"style": "long"})
    assert calls == ["summarize", "publish"]
    assert edited.state["published"] == "LONG:60"
    history = store.history(edited.run_id, limit=None)
    assert history[-1].metadata["rerun_of"] == {"run_id": first.run_id,
                                                "from_step": "summarize"}
    assert store.get_run(first.run_id).head_id == first.checkpoint_id  # source untouched


def test_rerun_refusals_write_nothing(store: Store) -> None:
    calls: list[str] = []
    wf = pipeline(calls)
    gated = pitstop.Workflow("gated")

    @gated.step(wait_for="approval")
    def ask(state: dict[str, Any], approval: Any = None) -> dict[str, Any]:
        return {"approved": approval}

    @gated.step
    def after(state: dict[str, Any]) -> dict[str, Any]:
        return {}

    waiting = gated.start(store, {})
    queued = wf.enqueue(store, {})
    done = wf.start(store, {})
    before = store.stats().runs
    with pytest.raises(pitstop.RerunError, match="never reached step 'after'"):
        gated.rerun(store, waiting.run_id, from_step="after")
    with pytest.raises(pitstop.RerunError, match="still queued"):
        wf.rerun(store, queued.id, from_step="clean")
    with pytest.raises(pitstop.RerunError, match="no step 'nope'"):
        wf.rerun(store, done.run_id, from_step="nope")
    with pytest.raises(pitstop.FieldEditError):
        wf.rerun(store, done.run_id, from_step="clean", update={"missing.deep": 1})
    assert store.stats().runs == before


def test_rerun_with_children_and_maps(store: Store) -> None:
    started: list[Any] = []
    mapped: list[int] = []
    child = pitstop.Workflow("child")

    @child.step
    def work(state: dict[str, Any]) -> dict[str, Any]:
        started.append(state["n"])
        return {"out": state["n"] * 2}

    parent = pitstop.Workflow("parent")

    @parent.step
    def prepare(state: dict[str, Any]) -> dict[str, Any]:
        return {"n": state.get("n", 1)}

    @parent.step(cache=CachePolicy(inputs=["n"]))
    def fan_out(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
        result = ctx.run_child(child, {"n": state["n"]})
        squares = ctx.map(lambda i: mapped.append(i) or i * i, range(state["n"] + 2))
        return {"child": result.state["out"], "squares": squares}

    first = parent.start(store, {"n": 3})
    assert started == [3] and sorted(mapped) == [0, 1, 2, 3, 4]
    runs = store.stats().runs
    again = parent.rerun(store, first.run_id, from_step="fan_out")
    assert started == [3] and len(mapped) == 5  # no child started, nothing mapped
    assert again.state["child"] == 6 and store.stats().runs == runs + 1
    changed = parent.rerun(store, first.run_id, from_step="fan_out", update={"n": 4})
    assert started == [3, 4]  # a child of changed inputs is never reused
    assert changed.state["child"] == 8 and changed.state["squares"] == [0, 1, 4, 9, 16, 25]


REPORT_FLOW = '''
import sys
import pitstop

wf = pitstop.Workflow("report")

@wf.step
def load(state):
    return {"rows": [1, 2, 3]}

@wf.step(cache=pitstop.CachePolicy(inputs=["rows", "style"]))
def summarize(state):
    print("SUMMARIZE", file=sys.stderr, flush=True)
    return {"summary": f"{state.get('style', 'short')}:{sum(state['rows'])}"}
'''


@pytest.mark.slow
def test_cli_rerun_cache_ls_clear_and_stats(tmp_path: Path) -> None:
    (tmp_path / "flows.py").write_text(REPORT_FLOW)
    url = f"sqlite:///{tmp_path}/cli.db"
    started = pitstop_exe("start", "flows:wf", "--input", '{"style": "short"}', "--json",
                          store=url, cwd=tmp_path)
    assert started.code == 0, started.err
    run_id = started.json["run_id"]
    again = pitstop_exe("rerun", run_id, "--from-step", "summarize", "--workflow", "flows:wf",
                        "--json", store=url, cwd=tmp_path)
    assert again.code == 0, again.err
    assert "SUMMARIZE" in started.err
    assert "SUMMARIZE" not in again.err and again.json["status"] == "completed"
    edited = pitstop_exe("rerun", run_id, "--from-step", "summarize", "--set", 'style="long"',
                         "--workflow", "flows:wf", "--json", store=url, cwd=tmp_path)
    assert edited.code == 0, edited.err
    assert "SUMMARIZE" in edited.err
    shown = pitstop_exe("show", edited.json["run_id"], "--json", store=url).json
    assert shown["state"]["summary"] == "long:6"
    refused = pitstop_exe("rerun", run_id, "--from-step", "nope", "--workflow", "flows:wf",
                          store=url, cwd=tmp_path)
    assert refused.code == 2 and one_error_line(refused).count("\n") == 0
    bad_edit = pitstop_exe("rerun", run_id, "--from-step", "summarize", "--set", "a.b=1",
                           "--workflow", "flows:wf", store=url, cwd=tmp_path)
    assert bad_edit.code == 2 and "nothing was written" in bad_edit.err
    listed = pitstop_exe("cache", "ls", "--json", store=url).json
    assert sorted(e["name"] for e in listed) == ["summarize", "summarize"]
    assert "summarize" in pitstop_exe("cache", "ls", store=url).out
    stats = pitstop_exe("stats", "--json", store=url).json
    assert stats["cache_entries"] == 2
    assert pitstop_exe("cache", "clear", "--older-than", "1h", "--json",
                       store=url).json == {"deleted": 0}
    assert pitstop_exe("cache", "clear", "--step", "summarize", "--json",
                       store=url).json == {"deleted": 2}
    assert pitstop_exe("stats", "--json", store=url).json["cache_entries"] == 0


@pytest.mark.slow
def test_inspector_run_page_shows_cached(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from pitstop.ui import create_app

    calls: list[Any] = []
    wf = counting_workflow("inspected", calls)
    with pitstop.open_store(f"sqlite:///{tmp_path}/ui.db") as store:
        first = wf.start(store, {"url": "a"})
        second = wf.start(store, {"url": "a"})
        with TestClient(create_app(store)) as client:
            tree = client.get(f"/api/runs/{second.run_id}/history").json()
            served = [c["cached"] for c in tree["checkpoints"] if c["cached"]]
            assert served == [[{"step": "fetch", "run": first.run_id}]]
            page = client.get(f"/runs/{second.run_id}").text
            assert 'class="pill cached"' in page and first.run_id in page


# -- damaged entries -------------------------------------------------------------------------


def test_a_damaged_entry_is_reported_and_read_as_a_miss(tmp_path: Path) -> None:
    import sqlite3

    url = f"sqlite:///{tmp_path}/damaged.db"
    calls: list[Any] = []
    wf = counting_workflow("damaged", calls)
    with pitstop.open_store(url) as store:
        first = wf.start(store, {"url": "a"})
        wf.start(store, {"url": "b"})
        assert not store.verify()
    with sqlite3.connect(tmp_path / "damaged.db") as conn:  # a's field map truncated
        conn.execute("UPDATE pitstop_cache SET fields = substr(fields, 1, length(fields) - 1) "
                     "WHERE run_id = ?", (first.run_id,))
    with pitstop.open_store(url) as store:
        problems = store.verify()
        assert [(p.kind, p.run_id) for p in problems] == [("cache", first.run_id)]
        assert "checksum mismatch" in problems[0].message
        # A read is a miss: the step runs again and its result replaces the damaged one.
        again = wf.start(store, {"url": "a"})
        assert again.state["html"] == "<p>a</p>" * 3 and len(calls) == 3
        wf.start(store, {"url": "a"})
        assert len(calls) == 3 and not store.verify()
        keys = {e.key for e in store.cache_entries()}
    with sqlite3.connect(tmp_path / "damaged.db") as conn:
        # A value the entries hold apart from their maps (the shared `pages` list),
        # overwritten with bytes that are not that value.
        held = {bytes(h) for (h,) in conn.execute(
            "SELECT hash FROM pitstop_blob_refs WHERE run_id LIKE 'pitstop-cache:%'")}
        assert held
        conn.executemany("UPDATE pitstop_blobs SET data = x'0102' WHERE hash = ?",
                         [(h,) for h in held])
    with pitstop.open_store(url) as store:
        damaged = {p.id for p in store.verify() if p.kind == "cache"}
        assert damaged == keys
        assert all(store.cache_get(key) is None for key in keys)  # a miss, not a crash
    verify = pitstop_exe("verify", store=url)
    assert verify.code != 0 and "cache step:damaged:fetch:" in verify.out + verify.err
