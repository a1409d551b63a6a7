"""Durability tested by killing real processes with SIGKILL, not by trusting the code.

Each test runs a writer in a separate interpreter, kills it at random moments, and checks what
a fresh process finds in the store afterwards.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import faults
import pitstop
import workflows
from conftest import ROOT
from pitstop import RunNotFoundError, RunStatus
from pitstop.runtime import run_until_idle

pytestmark = pytest.mark.slow

SAVER = """
import hashlib, os, signal, sys, time
import pitstop

def save_forever(url, first_saved):
    store = pitstop.open_store(url)
    i = 0
    latest = store.latest("r")
    if latest is not None:
        i = latest.state["i"] + 1
    while True:
        payload = os.urandom(20_000 + (i * 7919) % 200_000)
        store.save("r", {"i": i, "payload": payload, "check": hashlib.sha256(payload).hexdigest(),
                         "small": "x" * (i % 50)}, metadata={"i": i})
        if first_saved is not None:
            os.write(first_saved, b"s")
            os.close(first_saved)
            first_saved = None
        i += 1

# One round per line on stdin (the delay): fork a saver, SIGKILL it that long after its first
# save, say whether it was still running. The test reads the store between rounds.
for line in sys.stdin:
    ready, first_saved = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(ready)
        try:
            save_forever(sys.argv[1], first_saved)
        finally:
            os._exit(1)
    os.close(first_saved)
    # Timed from its first save, not from the fork: the kills land inside saves.
    os.read(ready, 1)
    os.close(ready)
    time.sleep(float(line))
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    print("killed" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
          else f"ended {os.waitstatus_to_exitcode(status)}", flush=True)
"""


def _spawn(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_killed_saver_never_leaves_a_torn_checkpoint(tmp_path: Path, durability: str) -> None:
    url = f"sqlite:///{tmp_path / 'kill.db'}?durability={durability}"
    rng = random.Random(1234)
    seen = -1
    kills = 0
    saver = _spawn(SAVER, url)  # one interpreter; a forked saver process per round
    assert saver.stdin is not None and saver.stdout is not None
    try:
        for _ in range(15):
            saver.stdin.write(f"{rng.uniform(0.05, 0.45):.3f}\n")
            saver.stdin.flush()
            outcome = saver.stdout.readline().strip()
            assert outcome == "killed", (outcome, saver.stderr.read() if outcome == "" else "")
            kills += 1
            with pitstop.open_store(url) as store:
                latest = store.latest("r")
                assert latest is not None  # the saver had saved once
                state = latest.state
                assert hashlib.sha256(state["payload"]).hexdigest() == state["check"]
                assert state["small"] == "x" * (state["i"] % 50)
                assert latest.metadata == {"i": state["i"]}
                assert state["i"] > seen  # never goes backwards; each round saved at least once
                seen = state["i"]
                steps = [s.metadata["i"] for s in store.history("r", limit=None)]
                assert steps == list(range(seen, -1, -1))  # complete, contiguous, no duplicates
    finally:
        saver.stdin.close()
        saver.wait(timeout=60)
    assert kills == 15 and seen > 10
    with pitstop.open_store(url) as store:
        assert store.verify() == []


# -- arrays in the blob directory: files written (and with `normal`, not synced) before commit ---

ARRAY_SAVER = """
import hashlib, os, signal, sys, time
import numpy as np
import pitstop

def save_forever(url, first_saved):
    # A 4.25 MiB array and a dict of two: 1 MiB chunks in files of the blob directory, the
    # tails in the database. Each save changes a few chunks (new files) and keeps the rest.
    store = pitstop.open_store(url)
    latest = store.latest("r")
    i = latest.state["i"] + 1 if latest is not None else 0
    rng = np.random.default_rng(i)
    w = rng.standard_normal((17 << 20) // 16, dtype=np.float32)
    model = {"a": rng.standard_normal(3 << 18, dtype=np.float32), "b": np.arange(5 << 18)}
    while True:
        w[rng.integers(0, w.size, 3)] += 1.0
        model["a"][rng.integers(0, model["a"].size)] = i
        check = hashlib.sha256(w.tobytes() + model["a"].tobytes() + model["b"].tobytes())
        store.save("r", {"i": i, "w": w, "model": model, "check": check.hexdigest()},
                   metadata={"i": i})
        if first_saved is not None:
            os.write(first_saved, b"s")
            os.close(first_saved)
            first_saved = None
        i += 1
""" + SAVER[SAVER.index("# One round per line"):]


@pytest.mark.parametrize("durability", ["normal", "full"])
def test_killed_array_saver_leaves_every_checkpoint_whole(tmp_path: Path, durability: str) -> None:
    """SIGKILL during saves of arrays whose chunks are blob-directory files (with ``normal``,
    written but not fsynced): the previous checkpoint stays whole, the one being written is
    complete or absent, and every checkpoint's arrays load and match their checksum."""
    url = f"sqlite:///{tmp_path / 'arrays.db'}?durability={durability}"
    rng = random.Random(4321)
    seen = -1
    saver = _spawn(ARRAY_SAVER, url)
    assert saver.stdin is not None and saver.stdout is not None
    try:
        for _ in range(8):
            saver.stdin.write(f"{rng.uniform(0.02, 0.4):.3f}\n")
            saver.stdin.flush()
            outcome = saver.stdout.readline().strip()
            assert outcome == "killed", (outcome, saver.stderr.read() if outcome == "" else "")
            with pitstop.open_store(url) as store:
                history = store.history("r", limit=None)
                steps = [c.metadata["i"] for c in history]
                assert steps == list(range(steps[0], -1, -1))  # no gap, no torn one
                assert steps[0] > seen
                seen = steps[0]
                for summary in history[:3]:  # the newest, whose files were just written
                    state = store.get(summary.id).state
                    data = (state["w"].tobytes() + state["model"]["a"].tobytes()
                            + state["model"]["b"].tobytes())
                    assert hashlib.sha256(data).hexdigest() == state["check"], summary.id
                assert state["model"]["b"].dtype == np.arange(1).dtype
    finally:
        saver.stdin.close()
        saver.wait(timeout=60)
    assert any((tmp_path / "arrays.db-blobs").rglob("*.pack"))  # the files were the test
    with pitstop.open_store(url) as store:
        assert store.verify() == []


# -- the runtime: 100 steps, killed at random points, resumed until done --------------------------

RUNNER = """
import json, os, random, signal, sys, threading, traceback
sys.path.insert(0, "tests")
import pitstop, workflows
url, run_id, log, variant, min_kills, seed = sys.argv[1:7]
wf = {"normal": workflows.counter, "background": workflows.counter_background,
      "every5": workflows.counter_every_5}[variant]

def attempt(kill_after):
    # A forked process of its own: SIGKILLed from another thread at a random moment of the
    # run, wherever the main thread is: inside a step, an effect, a save, a commit.
    if kill_after > 0:
        threading.Timer(kill_after, os.kill, (os.getpid(), signal.SIGKILL)).start()
    store = pitstop.open_store(url)
    try:
        store.get_run(run_id)
    except pitstop.RunNotFoundError:
        result = wf.start(store, workflows.counter_input(log), run_id=run_id)
    else:
        result = wf.resume(store, run_id)
    # Leave at once, as if killed right after: nothing may rely on a clean exit.
    return result.status is pitstop.RunStatus.COMPLETED

rng, kills = random.Random(int(seed)), 0
for attempts in range(1, 201):
    # Up to about half a quiet run (100 steps of 3 ms): on a fast machine a longer delay
    # mostly lets the run finish first, and the kills would not reach min_kills.
    delay = rng.uniform(0.0, 0.15) if kills < int(min_kills) else 0.0
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if attempt(delay) else 3)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        kills += 1
        continue
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        print(json.dumps({"kills": kills, "attempts": attempts}))
        sys.exit(0)
    if code != 3:
        sys.exit(f"attempt {attempts} ended with {code}")
sys.exit("the run never completed in 200 attempts")
"""


def _uninterrupted(log: Path, variant: str) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    import workflows

    wf = {"normal": workflows.counter, "background": workflows.counter_background,
          "every5": workflows.counter_every_5}[variant]
    with pitstop.open_store("memory://") as store:
        result = wf.start(store, workflows.counter_input(str(log)))
    state = dict(result.state)
    state.pop("nonces")
    return state


def _check_effects(store: pitstop.Store, run_id: str, log: Path) -> None:
    """Every effect ran at least once, and never again after its result was recorded."""
    lines = [line.split() for line in log.read_text().splitlines()]
    recorded = {k.split(":")[-1]: v for k, v in store.effects(run_id).items()}
    assert set(recorded) == {f"log-{n}" for n in range(100) if n % 7 == 3}
    for name, nonce in recorded.items():
        calls = [n for key, n in lines if key.endswith(f":{name}")]
        assert calls, name
        # the recorded call is the last one: nothing ran after the record was written
        assert calls[-1] == nonce, f"{name} ran again after its result was recorded"
    final = store.latest(run_id)
    assert final is not None
    assert final.state["nonces"] == [recorded[f"log-{n}"] for n in range(100) if n % 7 == 3]


@pytest.mark.parametrize(("variant", "min_kills"), [("normal", 50), ("every5", 12),
                                                  ("background", 12)])
def test_sigkill_at_random_points_then_resume(
    tmp_path: Path, variant: str, min_kills: int
) -> None:
    """Runs killed until ``min_kills`` kills have landed inside them (a kill after a run
    completed does not count), each run then checked against an uninterrupted one."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    kills = 0
    env = {"COUNTER_STEP_DELAY": "0.003"}
    for r in itertools.count():
        if kills >= min_kills:
            break
        assert r < 40, f"only {kills} kills landed in 40 runs"
        run_id = f"crash-{variant}-{r}"
        log = tmp_path / f"{run_id}.log"
        expected = _uninterrupted(tmp_path / f"{run_id}.reference.log", variant)
        # One interpreter imports pitstop once and forks a process per attempt (killed at a
        # random moment until min_kills, then left to finish): the kills land in the run,
        # not in 50 interpreter start-ups (~0.2 s of CPU each).
        proc = _spawn(RUNNER, url, run_id, str(log), variant, str(min_kills - kills),
                      str(1000 * r + len(variant)), env=env)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        kills += json.loads(out)["kills"]
        with pitstop.open_store(url) as store:
            final = store.latest(run_id)
            assert final is not None and store.get_run(run_id).status is RunStatus.COMPLETED
            state = dict(final.state)
            state.pop("nonces")
            expected["log"] = str(log)
            assert state == expected
            _check_effects(store, run_id, log)
            assert store.verify() == []


# -- waiting across processes and lease races -----------------------------------------------------

APPROVAL = """
import sys
sys.path.insert(0, "tests")
import pitstop, workflows
url, action, run_id = sys.argv[1:4]
store = pitstop.open_store(url)
if action == "start":
    r = workflows.approval.start(store, {}, run_id=run_id)
elif action == "send":
    pitstop.send(store, run_id, "decision", {"approved": True, "by": "finance"})
    print("sent"); raise SystemExit
else:
    r = workflows.approval.resume(store, run_id)
print(r.status.value, ",".join(r.waiting_for))
"""




def test_wait_exit_send_resume_in_three_processes(shared_url: str) -> None:
    def run(*args: str) -> str:
        proc = _spawn(APPROVAL, shared_url, *args)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        return out.strip()

    assert run("start", "w1") == "waiting decision"
    assert run("send", "w1") == "sent"
    assert run("resume", "w1") == "completed"
    with pitstop.open_store(shared_url) as store:
        assert store.latest("w1").state["approver"] == "finance"  # type: ignore[union-attr]


RACER = """
import sys, time
sys.path.insert(0, "tests")
import pitstop
url, run_id = sys.argv[1:3]
wf = pitstop.Workflow("race", lease_ttl=float(sys.argv[3]))
@wf.step
def slow(state):
    time.sleep(float(sys.argv[4]))
    return {"by": sys.argv[5]}
store = pitstop.open_store(url)
try:
    r = wf.resume(store, run_id)
    print("ran", r.status.value)
except pitstop.RunBusyError:
    print("busy")
"""


def test_two_processes_resuming_one_run(shared_url: str) -> None:
    wf = pitstop.Workflow("race")
    wf.step(name="slow")(lambda state: state)
    with pitstop.open_store(shared_url) as store:
        wf.enqueue(store, {}, run_id="race")
    procs = [_spawn(RACER, shared_url, "race", "30", "1.5", f"p{i}") for i in range(2)]
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outs == ["busy", "ran completed"]
    with pitstop.open_store(shared_url) as store:
        assert len(store.history("race", limit=None)) == 2  # input + one completion: no fork


def test_dead_owner_on_this_host_is_taken_over_at_once(shared_url: str) -> None:
    wf = pitstop.Workflow("race")
    wf.step(name="slow")(lambda state: state)
    with pitstop.open_store(shared_url) as store:
        wf.enqueue(store, {}, run_id="orphan")
    owner = _spawn(RACER, shared_url, "orphan", "30", "30", "dead")
    deadline = time.monotonic() + 30
    with pitstop.open_store(shared_url) as store:
        while store.get_run("orphan").owner is None:  # wait until it is inside its step
            assert time.monotonic() < deadline
            time.sleep(0.05)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    # Its lease has 30 s left, but its process is gone: no need to wait.
    late = _spawn(RACER, shared_url, "orphan", "30", "0", "next").communicate(timeout=60)[0]
    assert late.strip() == "ran completed"
    with pitstop.open_store(shared_url) as store:
        assert store.latest("orphan").state == {"by": "next"}  # type: ignore[union-attr]


RESUMER = """
import sys
import pitstop
wf = pitstop.Workflow("race", lease_ttl=30)
wf.step(name="slow")(lambda state: {"by": "resumer"})
store = pitstop.open_store(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:  # one resume per line (a run id), by a process started beforehand
    try:
        print("ran", wf.resume(store, line.strip()).status.value, flush=True)
    except pitstop.RunBusyError:
        print("busy", flush=True)
"""


def test_owner_elsewhere_is_waited_out_until_its_lease_expires(shared_url: str) -> None:
    """A lease of a worker on another host is never taken over early (no pid to check):
    a resume while it lasts is refused, one after it expires runs. The resumes come from
    a process started beforehand, so a short lease outlives the early one; should it not
    (a loaded machine: the answer came after the expiry), a longer lease is tried."""
    wf = pitstop.Workflow("race")
    wf.step(name="slow")(lambda state: state)
    resumer = _spawn(RESUMER, shared_url)
    asks, answers = resumer.stdin, resumer.stdout
    assert asks is not None and answers is not None

    def resume(run_id: str) -> str:
        asks.write(run_id + "\n")
        asks.flush()
        return answers.readline().strip()

    try:
        assert answers.readline().strip() == "ready"
        for ttl in (1.0, 4.0, 16.0):
            run_id = f"remote-{ttl:g}"
            with pitstop.open_store(shared_url) as store:
                wf.enqueue(store, {}, run_id=run_id)
                held = store.acquire(run_id, "another-host:4242:abcdef", ttl=ttl)
            early = resume(run_id)
            if early == "ran completed" and time.time() >= held.expires_at:
                continue  # the early resume was not early
            assert early == "busy"
            time.sleep(max(0.0, held.expires_at - time.time()) + 0.1)
            assert resume(run_id) == "ran completed"
            with pitstop.open_store(shared_url) as store:
                assert store.latest(run_id).state == {"by": "resumer"}  # type: ignore[union-attr]
            return
        pytest.fail("no resume came within a 16 s lease")
    finally:
        asks.close()
        resumer.wait(timeout=60)


CONTENDER = """
import sys
import pitstop
url, name = sys.argv[1:3]
store = pitstop.open_store(url)
for i in range(150):
    store.save(name, {"i": i, "who": name})
    store.save("common", {"last": name, "i": i})
    assert store.latest(name).state["i"] == i
print("ok")
"""


def test_processes_sharing_a_sqlite_file_never_see_database_is_locked(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    pitstop.open_store(url).close()
    procs = [_spawn(CONTENDER, url, f"p{i}") for i in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        assert out.strip() == "ok" and "locked" not in err
    with pitstop.open_store(url) as store:
        common = store.history("common", limit=None)
        assert len(common) == 600
        # appended from four processes at once, and still one chain: no silent fork
        assert all(a.parent_id == b.id for a, b in itertools.pairwise(common))
        assert all(len(store.history(f"p{i}", limit=None)) == 150 for i in range(4))
        assert store.verify() == []



# -- a run killed between its creation and its first checkpoint ---------------------------------

BIRTH = faults.KILL_AT_STATEMENT + """
import json, sys
import pitstop, workflows
url, action, points = sys.argv[1], sys.argv[2], range(int(sys.argv[3]))

def birth(at):
    store = pitstop.open_store(url)
    if action == "start":
        workflows.approval.start(store, {"n": 1}, run_id=f"born-{at}")
    elif action == "fork":
        workflows.approval.fork(store, store.latest("base").id, run_id=f"born-{at}")
    else:
        workflows.approval.enqueue(store, {"n": 1}, run_id=f"born-{at}")

print(json.dumps(fork_each(points, birth, r"INSERT INTO pitstop_runs\\b")))
"""


@pytest.mark.parametrize("action", ["start", "enqueue", "fork"])
def test_killed_between_creating_a_run_and_its_first_checkpoint(
    shared_url: str, action: str
) -> None:
    """SIGKILL at every SQL statement from the run's row to the end of ``start``/``enqueue``
    (or ``fork``, whose new run is born the same way; a forked process per kill point).
    The run's row and its input checkpoint commit together, so each kill left the whole
    run or nothing: ``resume`` continues a run that
    exists (the input is there to restart from) and says there is no run otherwise (there
    is no input to start from: the caller's start again creates it). Whichever it hit, the
    same call again converges on one run, and workers then drain every run, the healthy
    ones queued behind included (no wedged pool)."""
    with pitstop.open_store(shared_url) as store:
        for i in range(3):
            workflows.approval.enqueue(store, {"n": 1}, run_id=f"healthy-{i}")
        base = workflows.approval.start(store, {"n": 1}, run_id="base").checkpoint_id
        assert base is not None
    points = 24  # more statements than either call runs after the run's row
    proc = faults.run(faults.python(BIRTH, shared_url, action, str(points)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    outcomes = json.loads(proc.stdout)
    assert outcomes.count(-signal.SIGKILL) >= 3, outcomes
    assert outcomes[-1] == 0, (outcomes, proc.stderr)  # the last point is past the call's end
    written = []
    with pitstop.open_store(shared_url) as store:
        for at in range(points):
            run_id = f"born-{at}"
            try:
                run = store.get_run(run_id)
            except RunNotFoundError:
                written.append(False)
                with pytest.raises(RunNotFoundError, match=run_id):
                    workflows.approval.resume(store, run_id)
            else:
                written.append(True)
                assert run.head_id is not None, at  # never a run without its input
                if action == "start" or at % 2:  # (the others are left to the workers)
                    resumed = workflows.approval.resume(store, run_id)
                    assert resumed.status is RunStatus.WAITING, at
            if action == "start":
                again = workflows.approval.start(store, {"n": 1}, run_id=run_id)
                assert again.status is RunStatus.WAITING, at
            elif action == "fork":
                if not written[-1]:  # (a fork is not idempotent: its run id is new)
                    forked = workflows.approval.fork(store, base, run_id=run_id)
                    assert forked.status is RunStatus.WAITING, at
            else:
                assert workflows.approval.enqueue(store, {"n": 1}, run_id=run_id).id == run_id
            assert len([h for h in store.history(run_id, limit=None)
                        if h.source in ("input", "fork")]) == 1, at
        assert True in written and False in written, written  # kills before and after commit
        started = time.monotonic()
        stats = run_until_idle(store, workflows.approval)
        assert time.monotonic() - started < 60
        assert stats.errors == 0
        for run in store.runs(limit=None):
            assert run.status is RunStatus.WAITING, run  # every run reached its wait
            assert store.latest(run.id) is not None
        assert store.verify() == []
