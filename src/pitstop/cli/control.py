"""The commands that change where runs stand: ``send`` an input, ``start``/``enqueue`` a
run, ``resume``/``fork`` one here, run a ``worker``, ``cancel``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from pitstop.display.runs import run_json
from pitstop.errors import FieldEditError, PitstopError
from pitstop.model import RunStatus

from .common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CliError,
    Session,
    find_in_run,
    load_workflow,
    parse_json,
    resolve,
    run_reference,
)
from .group import command
from .render import local_time, status_cell

if TYPE_CHECKING:
    from pitstop.runtime import RunResult, Workflow


@command("send", examples=["pitstop send 7f3a9c approval '{\"approved\": true}'",
                           "pitstop send 7f3a9c review @review.json"])
@click.argument("run_id", metavar="RUN")
@click.argument("name")
@click.argument("payload", metavar="JSON|@FILE")
def send(s: Session, run_id: str, name: str, payload: str) -> None:
    """Deliver input NAME to a waiting run (JSON inline, @file.json, or - for stdin).

    The run continues when resumed (`pitstop resume`, or a worker). Refused, with nothing
    stored, if the run does not wait for NAME or has finished.
    """
    value = parse_json(payload, f"the payload of input {name!r}")
    store = s.store()
    run_id = run_reference(store, run_id)[0].id
    delivered = store.send(run_id, name, value)
    run = store.get_run(run_id)
    try:
        pending = set(store.inputs(run_id))
    except PitstopError:  # an undecodable earlier input: say what we know
        pending = {name}
    remaining = [w for w in run.waiting_for if w not in pending]
    if s.as_json:
        s.out.json({"run_id": run_id, "input_id": delivered.id, "name": name,
                    "waiting_for": remaining, "ready": not remaining})
        return
    s.out.line(f"delivered input {name!r} to run {run_id} (input {delivered.id})", "green")
    if remaining:
        s.out.line(f"run {run_id} still waits for: {', '.join(remaining)}")
    else:
        s.out.line(f"run {run_id} waits for nothing more: it continues when resumed "
                   f"(pitstop resume {run_id} --workflow MODULE:ATTR, or a worker)")


def _result(s: Session, result: RunResult, *, note: str | None = None) -> int:
    """Print where a run stands; ``note`` says why nothing ran (a resume with nothing to do)."""
    error = dict(result.error) if result.error else None
    if s.as_json:
        s.out.json({
            **({"nothing_ran": note} if note else {}),
            "run_id": result.run_id,
            "status": result.status.value,
            "step": result.step,
            "waiting_for": list(result.waiting_for),
            "wake_at": result.wake_at,
            "checkpoint_id": result.checkpoint_id,
            "error": error,
        })
    else:
        if note:
            s.out.line(note, "yellow")
        s.out.fields([
            ("run", result.run_id),
            ("status", status_cell(result.status.value)),
            ("step", result.step or "-"),
            ("waiting for", ", ".join(result.waiting_for)),
            ("wake at", local_time(result.wake_at) if result.wake_at else ""),
            ("checkpoint", result.checkpoint_id or "-"),
            ("error", _headline(error) if error else ""),
        ])
        if error:
            s.out.note(f"pitstop show {result.run_id} shows the traceback")
    return EXIT_PROBLEMS if result.status is RunStatus.FAILED else EXIT_OK


def _headline(error: Mapping[str, Any]) -> str:
    message = str(error.get("message") or "").strip()
    first = message.splitlines()[0] if message else ""
    return f"{error.get('type')}: {first}" if first else str(error.get("type"))


WORKFLOW_HELP = ("The workflow object, as module:attr (the current directory is importable). "
                 "Default: $PITSTOP_WORKFLOW.")


INPUT_HELP = ("The run's input (its first state): JSON inline, @file.json, or - for stdin. "
              "Converted to the workflow's state type like fork --set. Default: no input.")


def _input(workflow: Workflow, text: str | None) -> dict[str, Any]:
    """The ``--input`` of ``start``/``enqueue`` as the workflow's state fields, typed by its
    state type (nested dataclasses built from JSON objects), or one error line."""
    from pitstop.edits import apply_field_edits

    if text is None:
        return {}
    value = parse_json(text, "--input")
    if not isinstance(value, Mapping):
        raise CliError(f"--input must be a JSON object of state fields, not {type(value).__name__}")
    try:
        fields = apply_field_edits({}, value, add=True, state_type=workflow.state_type)
        workflow.adapter.fields_of(fields)  # what start would do: refuse it before writing
    except FieldEditError as exc:
        raise CliError(f"--input: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CliError(f"--input does not fit the state of workflow {workflow.name!r}: "
                       f"{' '.join(str(exc).split())}") from None
    return fields


@command("start", examples=["pitstop start flows:approval --input '{\"vendor\": \"Acme\"}'",
                            "pitstop start flows:approval --input @vendor.json --run-id acme-1",
                            "cat vendor.json | pitstop start flows:approval --input -"])
@click.argument("spec", metavar="MODULE:ATTR")
@click.option("--input", "input_text", metavar="JSON|@FILE|-", help=INPUT_HELP)
@click.option("--run-id", "run_id", metavar="ID", help="Id of the new run (default: a new id).")
def start(s: Session, spec: str, input_text: str | None, run_id: str | None) -> int:
    """Start a run of a workflow and execute it here until it completes, waits or fails.

    MODULE:ATTR names the workflow object (the current directory is importable). Creates
    the store if there is none yet. Exits 1 if the run failed; `pitstop show RUN` says why.
    """
    workflow = load_workflow(spec)
    fields = _input(workflow, input_text)
    store = s.store(create=True, upgrade=True)
    return _result(s, workflow.start(store, fields, run_id=run_id))


@command("enqueue", examples=[
    "pitstop enqueue flows:approval --input '{\"vendor\": \"Acme\"}' --priority 5",
    "pitstop enqueue flows:approval --input @vendor.json --run-id acme-1 --json"])
@click.argument("spec", metavar="MODULE:ATTR")
@click.option("--input", "input_text", metavar="JSON|@FILE|-", help=INPUT_HELP)
@click.option("--run-id", "run_id", metavar="ID", help="Id of the new run (default: a new id).")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Workers take runs of higher priority first.")
def enqueue(s: Session, spec: str, input_text: str | None, run_id: str | None,
            priority: int) -> None:
    """Queue a run of a workflow for a worker (`pitstop worker`) and return at once.

    Creates the store if there is none yet.
    """
    workflow = load_workflow(spec)
    fields = _input(workflow, input_text)
    store = s.store(create=True, upgrade=True)
    run = workflow.enqueue(store, fields, run_id=run_id, priority=priority)
    if s.as_json:
        s.out.json(run_json(run))
        return
    s.out.line(f"queued run {run.id} ({workflow.name})", "green")
    s.out.note(f"a worker runs it: pitstop worker --workflow {spec}")


@command("resume", examples=["pitstop resume 7f3a9c --workflow flows:approval",
                             "pitstop resume 7f3a9c --from 1b2c3d4e --workflow flows:approval"])
@click.argument("run_id", metavar="RUN")
@click.option("--from", "ref", metavar="ID",
              help="Resume from this earlier checkpoint of the run, on a new branch.")
@click.option("--workflow", "spec", metavar="MODULE:ATTR", required=True,
              envvar="PITSTOP_WORKFLOW", help=WORKFLOW_HELP)
def resume(s: Session, run_id: str, ref: str | None, spec: str) -> int:
    """Continue a run in this process until it completes, waits or fails; print where it is.

    Exits 1 if the run failed.
    """
    workflow = load_workflow(spec)
    store = s.store()
    run, at = run_reference(store, run_id)
    if at is not None and ref is not None:
        raise CliError(f"{run_id!r} names a checkpoint already; drop --from {ref}")
    checkpoint_id = at or (find_in_run(store, run.id, ref) if ref is not None else None)
    result = workflow.resume(store, run.id, from_checkpoint=checkpoint_id)
    idle = checkpoint_id is None and result.checkpoint_id == run.head_id
    return _result(s, result, note=_nothing_ran(result, spec) if idle else None)


def _nothing_ran(result: RunResult, spec: str) -> str:
    """What a resume that ran nothing found, and the way on from there."""
    run_id = result.run_id
    if result.status is RunStatus.COMPLETED:
        return (f"run {run_id} had already completed: nothing was run (to run it again from a "
                f"checkpoint: pitstop fork {run_id}@ID --workflow {spec})")
    if result.status is RunStatus.CANCELLED:
        return (f"run {run_id} is cancelled: nothing was run (pitstop fork {run_id} "
                f"--workflow {spec} starts a new run from where it stopped)")
    if result.status is RunStatus.WAITING and result.waiting_for:
        names = ", ".join(repr(name) for name in result.waiting_for)
        first = result.waiting_for[0]
        return (f"run {run_id} still waits for input {names}: nothing was run (deliver it "
                f"with pitstop send {run_id} {first} JSON, then resume)")
    if result.status is RunStatus.WAITING and result.wake_at:
        return (f"run {run_id} sleeps until {local_time(result.wake_at)}: nothing was run "
                "(resume it then, or let a worker)")
    return f"run {run_id} is {result.status.value}: nothing was run"


def _edits(assignments: Sequence[str]) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    for item in assignments:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise CliError(f"--set {item!r} must look like FIELD=JSON (e.g. --set 'count=3' "
                           "or --set 'plan.goal=\"ship\"')")
        edits[name] = parse_json(text, f"--set {name}")
    return edits


@command("fork", examples=["pitstop fork 7f3a9c@1b2c3d4e --set 'budget=5000' "
                           "--workflow flows:approval",
                           "pitstop fork 7f3a9c --set 'plan.goal=\"ship\"' --workflow flows:wf",
                           "pitstop fork 7f3a9c --workflow flows:approval --run-id 7f3a9c-retry"])
@click.argument("ref", metavar="CHECKPOINT")
@click.option("--set", "assignments", multiple=True, metavar="FIELD=JSON",
              help="Replace a state field, or a value inside one (plan.goal, messages[-1]), "
                   "in the new run (repeatable). The JSON is converted to the type the field "
                   "holds (a dataclass, a pydantic model, a datetime...) or refused.")
@click.option("--add", is_flag=True,
              help="Allow --set to add fields (and mapping keys) the state does not have yet.")
@click.option("--workflow", "spec", metavar="MODULE:ATTR", required=True,
              envvar="PITSTOP_WORKFLOW", help=WORKFLOW_HELP)
@click.option("--run-id", "new_run_id", metavar="NEW", help="Id of the new run (default: new).")
def fork(
    s: Session, ref: str, assignments: tuple[str, ...], add: bool, spec: str,
    new_run_id: str | None,
) -> int:
    """Start a new run from a checkpoint (of any run), optionally with edited fields, and run it.

    CHECKPOINT is a checkpoint id, a run id (its latest checkpoint) or RUN@ID. The source
    run is not changed. An edit naming a field the state does not have, or a value that does
    not fit the field's type, is refused (exit 2) and nothing is written. Exits 1 if the new
    run failed.
    """
    edits = _edits(assignments)
    workflow = load_workflow(spec)
    store = s.store()
    checkpoint_id = resolve(store, ref)
    try:  # the edits are checked by Workflow.fork, as for a Python caller
        result = workflow.fork(store, checkpoint_id, update=edits, run_id=new_run_id, add=add)
    except FieldEditError as exc:
        raise CliError(f"--set: {exc} (nothing was written)") from None
    return _result(s, result)


@command("rerun", examples=["pitstop rerun 7f3a9c --from-step summarize --workflow flows:report",
                            "pitstop rerun 7f3a9c --from-step summarize --set 'style=\"long\"' "
                            "--workflow flows:report"])
@click.argument("run_id", metavar="RUN")
@click.option("--from-step", "from_step", metavar="STEP", required=True,
              help="The step to run again (from the checkpoint before it last ran).")
@click.option("--set", "assignments", multiple=True, metavar="FIELD=JSON",
              help="Replace a state field, or a value inside one, in the new run "
                   "(repeatable; checked like `fork --set`).")
@click.option("--workflow", "spec", metavar="MODULE:ATTR", required=True,
              envvar="PITSTOP_WORKFLOW", help=WORKFLOW_HELP)
@click.option("--run-id", "new_run_id", metavar="NEW", help="Id of the new run (default: new).")
def rerun(
    s: Session, run_id: str, from_step: str, assignments: tuple[str, ...], spec: str,
    new_run_id: str | None,
) -> int:
    """Run a run again from a named step, as a new run, and execute it.

    The steps before STEP are not executed again; steps after it with a cache policy whose
    inputs did not change are served from the cache. A run still running or queued, or one
    that never reached STEP, is refused (exit 2) and nothing is written. Exits 1 if the new
    run failed.
    """
    edits = _edits(assignments)
    workflow = load_workflow(spec)
    store = s.store()
    run = run_reference(store, run_id)[0]
    try:
        result = workflow.rerun(store, run.id, from_step=from_step, update=edits or None,
                                new_run_id=new_run_id)
    except FieldEditError as exc:
        raise CliError(f"--set: {exc} (nothing was written)") from None
    return _result(s, result)


def _finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value):  # nan passes FloatRange's bounds: no comparison holds
        raise click.BadParameter(f"{value} is not a number of seconds", ctx, param)
    return value


@command("worker", log_level="INFO", examples=[
    "pitstop worker --workflow flows:approval --concurrency 8",
    "pitstop worker --store postgresql://db/app --workflow a:wf --workflow b:wf --until-idle"])
@click.option("--workflow", "specs", metavar="MODULE:ATTR", multiple=True, required=True,
              help="A workflow to run (repeatable). " + WORKFLOW_HELP)
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs executed at once by this process (threads).")
@click.option("--limit", "limits", multiple=True, metavar="WORKFLOW=N",
              help="At most N runs of WORKFLOW at once in this process (repeatable).")
@click.option("--poll", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Seconds between looks for work when the store cannot notify.")
@click.option("--child-grace", type=click.FloatRange(min=0, max=3600), default=0.25,
              show_default=True, metavar="SECONDS", callback=_finite,
              help="How long a step that starts children waits in place, holding its run and "
                   "slot, for the pool to finish them: if they do, the step goes on at once; "
                   "if not, the run checkpoints as waiting and the last child wakes it. "
                   "0: wait as a checkpoint at once.")
@click.option("--until-idle", is_flag=True, help="Exit once nothing is runnable or running.")
@click.option("--metrics-port", type=click.IntRange(min=1, max=65535), default=None,
              metavar="PORT",
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (steps, checkpoints, "
                   "their time and bytes, runs by status, queue depth, oldest queued and "
                   "waiting age; needs pitstop[metrics]). See docs/observability.md.")
@click.option("--metrics-address", default="0.0.0.0", show_default=True, metavar="ADDRESS",
              help="The address --metrics-port listens on.")
def worker(s: Session, specs: tuple[str, ...], concurrency: int, limits: tuple[str, ...],
           poll: float, child_grace: float, until_idle: bool, metrics_port: int | None,
           metrics_address: str) -> None:
    """Claim and execute runnable runs of the given workflows until stopped.

    Runnable: queued (``wf.enqueue``), waiting with their inputs delivered or their timer
    due, or owned by a worker whose lease expired (it died). Start as many workers as you
    like on every machine that shares the store. SIGTERM or Ctrl-C: each run finishes its
    current step, checkpoints and is handed back; then the worker exits 0.
    """
    from ..runtime import Worker

    caps: dict[str, int] = {}
    for item in limits:
        name, sep, count = item.partition("=")
        if not sep or not count.isdigit():
            raise CliError(f"--limit {item!r} must look like WORKFLOW=N (e.g. --limit approval=2)")
        caps[name] = int(count)
    workflows = [load_workflow(spec) for spec in specs]
    store = s.store()
    if metrics_port is not None:
        _serve_metrics(store, metrics_port, metrics_address)
    else:
        # OpenTelemetry metrics set up around the worker (opentelemetry-instrument) observe
        # its store's gauges too; read only when a reader collects, nothing otherwise.
        from pitstop.observe import metrics

        metrics.watch(store)
    # (--child-grace's default is Worker's CHILD_GRACE, written out: the CLI does not import
    # the runtime to build its help; a test checks they agree.)
    stats = Worker(store, workflows, concurrency=concurrency, poll_interval=poll,
                   limits=caps, child_grace=child_grace).run(until_idle=until_idle)
    summary = {"executed": stats.executed, "by_status": dict(stats.by_status),
               "errors": stats.errors}
    if s.as_json:
        s.out.json(summary)
    else:
        done = ", ".join(f"{n} {k}" for k, n in sorted(stats.by_status.items())) or "nothing"
        s.out.line(f"executed {stats.executed} run(s): {done}")


def _serve_metrics(store: Any, port: int, address: str) -> None:
    """Start the /metrics endpoint, or say in one line why it cannot start."""
    from pitstop.observe import metrics

    try:
        metrics.serve(port, address=address, store=store)
    except ImportError:
        raise CliError("--metrics-port needs prometheus-client: "
                       "pip install 'pitstop[metrics]'") from None
    except OSError as exc:
        reason = "in use" if exc.errno in (98, 48) else (exc.strerror or str(exc))
        raise CliError(f"--metrics-port {port}: cannot listen on {address}:{port} "
                       f"({reason})") from None


@command("cancel", examples=["pitstop cancel 7f3a9c"])
@click.argument("run_id", metavar="RUN")
def cancel(s: Session, run_id: str) -> None:
    """Cancel a run: it will not be resumed or claimed by workers again.

    Its current owner, if any, loses its lease and its next write is refused.
    """
    store = s.store()
    run, _ = run_reference(store, run_id)
    run_id = run.id
    if run.status is RunStatus.COMPLETED:
        raise CliError(f"run {run_id!r} has completed; there is nothing to cancel")
    if run.status is not RunStatus.CANCELLED:
        store.update_run(run_id, status=RunStatus.CANCELLED)
    if s.as_json:
        s.out.json({"run_id": run_id, "status": "cancelled", "previous": run.status.value})
    elif run.status is RunStatus.CANCELLED:
        s.out.line(f"run {run_id} was already cancelled")
    else:
        s.out.line(f"cancelled run {run_id} (was {run.status.value})", "yellow")


__all__ = ["cancel", "enqueue", "fork", "resume", "send", "start", "worker"]
