"""Vendor approval: a workflow that waits days for a human without holding a process.

    vendor review -> security review -> wait for finance approval -> notify

Run the whole story (every stage in its own process, on the default SQLite store):

    python examples/vendor_approval.py demo

Or drive it by hand:

    python examples/vendor_approval.py start "Acme Corp"      # runs until it waits; exits
    python examples/vendor_approval.py approve RUN_ID dana    # delivers the decision; exits
    python examples/vendor_approval.py resume RUN_ID          # continues to completion
    python examples/vendor_approval.py fork CHECKPOINT_ID risk=high
    python examples/vendor_approval.py rewind RUN_ID CHECKPOINT_ID   # a branch of RUN_ID

The store is ``$PITSTOP_STORE`` or ``sqlite:///pitstop.db``; e-mails "sent" by the notify
step are appended to ``outbox.txt`` next to it (the outside world the workflow talks to).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pitstop

OUTBOX = Path(os.environ.get("PITSTOP_DEMO_OUTBOX", "outbox.txt"))

wf = pitstop.Workflow("vendor-approval")


@wf.step
def vendor_review(state: dict[str, Any]) -> dict[str, Any]:
    risk = "high" if "crypto" in state["vendor"].lower() else state.get("risk", "low")
    return {"vendor_review": "completed", "risk": risk}


@wf.step(milestone=True)
def security_review(state: dict[str, Any]) -> dict[str, Any]:
    checks = ["soc2", "pen-test"] + (["on-site audit"] if state["risk"] == "high" else [])
    return {"security_review": "completed", "security_checks": checks}


@wf.step(wait_for="finance_decision", timeout=timedelta(days=7))
def finance_approval(state: dict[str, Any], ctx: pitstop.StepContext,
                     finance_decision: Any) -> Any:
    if ctx.timed_out:
        return pitstop.finish({"finance": "expired"})
    if not finance_decision.get("approved"):
        return pitstop.finish({"finance": "rejected", "finance_by": finance_decision.get("by")})
    return {"finance": "approved", "finance_by": finance_decision.get("by")}


def send_email(to: str, subject: str, *, idempotency_key: str) -> str:
    """The side effect: a real system would pass ``idempotency_key`` to its mail API."""
    with OUTBOX.open("a") as f:
        f.write(f"to={to} subject={subject!r} key={idempotency_key}\n")
    return f"queued for {to}"


@wf.step
def notify(state: dict[str, Any], ctx: pitstop.StepContext) -> dict[str, Any]:
    receipt = ctx.effect(
        "email", send_email, "procurement@example.com", f"{state['vendor']} approved"
    )
    if os.environ.get("PITSTOP_DEMO_CRASH") == "notify":
        os.kill(os.getpid(), signal.SIGKILL)  # the e-mail went out; the process dies here
    return {"notified": receipt}


# -- the commands -------------------------------------------------------------------------------


def _print_result(result: pitstop.RunResult) -> None:
    print(f"run {result.run_id}: {result.status.value}", end="")
    if result.waiting_for:
        print(f", waiting for {', '.join(result.waiting_for)}", end="")
    print()
    print("  state:", json.dumps(result.state, sort_keys=True))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, args = argv[0], argv[1:]
    if command == "demo":
        return demo()
    store = pitstop.open_store()
    if command == "start":
        _print_result(wf.start(store, {"vendor": args[0] if args else "Acme Corp"}))
    elif command == "approve":
        by = args[1] if len(args) > 1 else "finance"
        pitstop.send(store, args[0], "finance_decision", {"approved": True, "by": by})
        print(f"run {args[0]}: finance_decision delivered; it resumes on the next `resume`")
    elif command == "resume":
        _print_result(wf.resume(store, args[0]))
    elif command == "fork":
        update = dict(item.split("=", 1) for item in args[1:])
        _print_result(wf.fork(store, args[0], update=update))
    elif command == "rewind":  # continue RUN from an earlier checkpoint, on a new branch
        _print_result(wf.resume(store, args[0], from_checkpoint=args[1]))
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    return 0


# -- the guided tour: each stage is a separate process ------------------------------------------


def _run(*args: str, env: dict[str, str] | None = None) -> str:
    cmd = [sys.executable, __file__, *args]
    print(f"\n$ python examples/vendor_approval.py {shlex.join(args)}")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False
    )
    print(proc.stdout.rstrip())
    if proc.returncode == -signal.SIGKILL:
        print("  (process killed with SIGKILL)")
    elif proc.returncode:
        print(proc.stderr, file=sys.stderr)
        raise SystemExit(proc.returncode)
    return proc.stdout


def _cli(*args: str) -> None:
    print(f"\n$ pitstop {shlex.join(args)}")
    proc = subprocess.run(
        [sys.executable, "-m", "pitstop", *args], capture_output=True, text=True, check=False
    )
    print((proc.stdout or proc.stderr).rstrip())


def demo() -> int:
    store_url = os.environ.get("PITSTOP_STORE", "sqlite:///pitstop.db")
    print(f"store: {store_url}   outbox: {OUTBOX}")

    print("\n== 1. start: the run reviews the vendor, then waits for finance and EXITS")
    out = _run("start", "Acme Corp")
    run_id = out.split()[1].rstrip(":")
    print("\n== 2. later, another process delivers the approval (no run process is alive)")
    _run("approve", run_id, "dana@finance")
    print("\n== 3. a third process resumes the run to completion")
    _run("resume", run_id)

    print("\n== 4. a crash: this time the process is killed right after sending the e-mail")
    second = _run("start", "Globex").split()[1].rstrip(":")
    _run("approve", second, "dana@finance")
    _run("resume", second, env={"PITSTOP_DEMO_CRASH": "notify"})
    print("   ...and a new process resumes from the last checkpoint:")
    _run("resume", second)
    sent = [line for line in OUTBOX.read_text().splitlines() if second in line]
    print(f"   e-mails sent for {second}: {len(sent)} (the effect was recorded, not repeated)")

    print("\n== 5. time travel: fork the first run from its security-review milestone,")
    print("      with edited state, as a new run; the original run is untouched")
    with pitstop.open_store(store_url) as store:
        checkpoint = next(c for c in store.history(run_id) if "security_review" in c.tags)
    out = _run("fork", checkpoint.id, "vendor=Acme Corp (EU entity)", "risk=high")
    fork_id = out.split()[1].rstrip(":")
    with pitstop.open_store(store_url) as store:
        fork_head = store.get_run(fork_id).head_id or ""
    _cli("diff", checkpoint.id, fork_head)

    print("\n== 6. rewind: continue the first run itself from that checkpoint, on a new branch;")
    print("      nothing is overwritten, and the history shows both branches")
    _run("rewind", run_id, checkpoint.id)
    _cli("history", run_id)
    _cli("history", fork_id)
    print("\nDone. Inspect more with `pitstop runs`, `pitstop show RUN`, `pitstop history RUN`.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
