"""Short ids: any unambiguous start of a run id, and RUN@ID wherever a run is taken.

``history`` prints 8-character checkpoint ids and the help shows ``pitstop show 7f3a9c``,
yet ``show 01a2326a-2e98`` and ``show RUN@09533dc6`` once said ``no run``. Real ``pitstop``
executable, real SQLite file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clitools import one_error_line, pitstop_exe, sqlite_rows

FLOWS = '''
import pitstop

wf = pitstop.Workflow("ids")


@wf.step
def one(state):
    return {"n": 1}


@wf.step
def two(state):
    return {"n": 2}


@wf.step(wait_for="go")
def three(state, go):
    return {"n": 3, "go": go}
'''


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "ids.py").write_text(FLOWS)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    for run_id in ("alpha-1", "alpha-2", "beta-1", None):
        extra = ["--run-id", run_id] if run_id else []
        assert pitstop_exe("start", "ids:wf", *extra, store=url, cwd=tmp_path).code == 0
    return tmp_path, url


def history(cwd: Path, url: str, run: str) -> list[dict[str, object]]:
    return pitstop_exe("history", run, "--json", store=url, cwd=cwd).json["checkpoints"]


@pytest.mark.slow
def test_a_unique_start_of_a_run_id_works_in_every_command(store: tuple[Path, str]) -> None:
    cwd, url = store
    generated = next(r["id"] for r in pitstop_exe("runs", "--json", store=url, cwd=cwd).json[
        "runs"] if not str(r["id"]).startswith(("alpha", "beta")))
    prefix = generated[:13]  # "01a2326a-2e98", as in the issue
    assert pitstop_exe("show", prefix, "--json", store=url, cwd=cwd).json["run"]["id"] == \
        generated
    # run ids are names: a start under 4 characters names a run too (#30)
    assert pitstop_exe("history", "b", "--json", store=url, cwd=cwd).json["run_id"] == "beta-1"
    assert pitstop_exe("history", "beta", "--json", store=url, cwd=cwd).json["run_id"] == \
        "beta-1"
    assert pitstop_exe("send", "beta", "go", "true", store=url, cwd=cwd).code == 0
    resumed = pitstop_exe("resume", "beta", "--workflow", "ids:wf", "--json", store=url, cwd=cwd)
    assert resumed.json["run_id"] == "beta-1" and resumed.json["status"] == "completed"
    assert pitstop_exe("export", "beta", "-o", "b.pitstop", store=url, cwd=cwd).code == 0
    assert (cwd / "b.pitstop").exists()
    assert pitstop_exe("prune", "--run", "beta", "--keep-last", "1", "--dry-run", store=url,
                       cwd=cwd).code == 0
    assert pitstop_exe("diff", "beta", "beta-1", "--json", store=url, cwd=cwd).json[
        "changes"] == []
    assert pitstop_exe("cancel", prefix, "--json", store=url, cwd=cwd).json["run_id"] == \
        generated


@pytest.mark.slow
def test_run_at_id_works_wherever_a_run_is_taken(store: tuple[Path, str]) -> None:
    cwd, url = store
    entries = history(cwd, url, "alpha-1")
    first = str(entries[-1]["id"])  # the input checkpoint
    short = first[-8:]
    shown = pitstop_exe("show", f"alpha-1@{short}", "--json", store=url, cwd=cwd).json
    assert shown["checkpoint"]["id"] == first and shown["state"] == {}
    assert pitstop_exe("show", f"alpha-1@{short}", "--json", store=url, cwd=cwd).json == \
        pitstop_exe("show", "alpha-1", "--checkpoint", short, "--json", store=url, cwd=cwd).json
    assert pitstop_exe("history", f"alpha-1@{short}", "--json", store=url, cwd=cwd).code == 0
    assert pitstop_exe("send", f"alpha-1@{short}", "go", "1", store=url, cwd=cwd).code == 0
    # resume RUN@ID continues from that checkpoint, on a new branch (as --from does)
    resumed = pitstop_exe("resume", f"alpha-1@{short}",
                          "--workflow", "ids:wf", "--json", store=url, cwd=cwd)
    assert resumed.code == 0, resumed
    assert any(c["note"] == f"resumed from {short}" for c in history(cwd, url, "alpha-1"))
    forked = pitstop_exe("fork", f"alpha-1@{short}", "--workflow", "ids:wf", "--run-id", "gamma",
                         "--json", store=url, cwd=cwd)
    assert forked.code == 0, forked


@pytest.mark.slow
def test_an_ambiguous_prefix_is_an_error_listing_the_candidates(store: tuple[Path, str]) -> None:
    cwd, url = store
    before = sqlite_rows(url)
    line = one_error_line(pitstop_exe("show", "alpha", store=url, cwd=cwd))
    assert "run id 'alpha' is ambiguous: 2 runs start with it" in line
    assert "alpha-1" in line and "alpha-2" in line
    line = one_error_line(pitstop_exe("cancel", "alpha", store=url, cwd=cwd))
    assert "ambiguous" in line
    # checkpoint ids of one run share their start (a UUIDv7 begins with its timestamp)
    start = str(history(cwd, url, "alpha-2")[0]["id"])[:8]
    line = one_error_line(pitstop_exe("show", f"alpha-2@{start}", store=url, cwd=cwd))
    assert f"checkpoint reference {start!r} is ambiguous in run 'alpha-2' (3 matches: " in line
    assert sqlite_rows(url) == before  # nothing was written, not even the cancel
    assert "no run 'zzzz'" in one_error_line(pitstop_exe("show", "zzzz", store=url, cwd=cwd))


@pytest.mark.slow
def test_a_unique_start_of_a_checkpoint_id_works_alone(store: tuple[Path, str]) -> None:
    cwd, url = store
    entries = history(cwd, url, "beta-1")
    head, first = str(entries[0]["id"]), str(entries[-1]["id"])
    # the start of an id is its timestamp: 24 characters pick one checkpoint out
    diffed = pitstop_exe("diff", first[:24], head[:24], "--json", store=url, cwd=cwd)
    assert diffed.code == 0, diffed
    assert diffed.json["a"]["id"] == first and diffed.json["b"]["id"] == head
    forked = pitstop_exe("fork", first[:24], "--workflow", "ids:wf", "--run-id", "delta",
                         "--json", store=url, cwd=cwd)
    assert forked.code == 0, forked
    # a start shared by several checkpoints (and no run) is an error listing them
    runs = [r["id"] for r in pitstop_exe("runs", "--json", store=url, cwd=cwd).json["runs"]]
    shared = next((first[:i] for i in range(len(first), 0, -1) if head.startswith(first[:i])),
                  "")
    if len(shared) < 4 or any(r.startswith(shared) for r in runs):
        pytest.skip("the checkpoint ids share no start that no run id has")
    line = one_error_line(pitstop_exe("diff", shared, head, store=url, cwd=cwd))
    assert f"checkpoint id {shared!r} is ambiguous: it starts" in line
    assert "beta-1@" in line


@pytest.mark.slow
def test_a_run_id_start_under_four_characters_lists_the_runs(store: tuple[Path, str]) -> None:
    cwd, url = store
    line = one_error_line(pitstop_exe("show", "a", store=url, cwd=cwd))
    assert "run id 'a' is ambiguous: 2 runs start with it" in line, line
    assert "alpha-1" in line and "alpha-2" in line


@pytest.mark.slow
def test_the_python_api_takes_the_short_forms_the_cli_prints(store: tuple[Path, str]) -> None:
    import importlib
    import sys

    import pitstop

    cwd, url = store
    entries = history(cwd, url, "alpha-1")
    first = str(entries[-1]["id"])
    sys.path.insert(0, str(cwd))
    try:
        wf = importlib.import_module("ids").wf
        with pitstop.open_store(url) as opened:
            forked = wf.fork(opened, f"alpha-1@{first[-8:]}", run_id="from-short")
            origin = opened.history("from-short", limit=None)[-1].metadata["forked_from"]
            assert origin["checkpoint_id"] == first
            assert forked.status is pitstop.RunStatus.WAITING
            # a run prefix alone names its latest checkpoint
            wf.fork(opened, "bet", run_id="from-prefix")
            assert opened.get_run("from-prefix").metadata["forked_from"] == "beta-1"
            # resume --from takes a short id as well
            resumed = wf.resume(opened, "alpha-1", from_checkpoint=first[-8:])
            assert resumed.run_id == "alpha-1"
            with pytest.raises(pitstop.AmbiguousReferenceError, match="2 runs start with it"):
                wf.fork(opened, "alpha")
    finally:
        sys.path.remove(str(cwd))
        sys.modules.pop("ids", None)
