"""``pitstop ui``: serve the web inspector (the ``ui`` extra) on a store.
"""

from __future__ import annotations

import click

from .common import CliError, Session, configure_logging, load_workflow
from .group import STORE_HELP, cli, logging_options


@cli.command("ui", epilog="\b\nExamples:\n  pitstop ui --store sqlite:///runs.db\n"
             "  PITSTOP_UI_TOKEN=alice:s3cret-token pitstop ui --host 0.0.0.0 "
             "--workflow flows:approval")
@click.option("--store", "store_url", metavar="URL", help=STORE_HELP)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; another than loopback needs a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--token", "tokens", multiple=True, metavar="[NAME:]SECRET",
              envvar="PITSTOP_UI_TOKEN",
              help="Require this token on every page and API call (repeatable; the name is "
                   "what actions record). Default: $PITSTOP_UI_TOKEN.")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option("--workflow", "specs", metavar="MODULE:ATTR", multiple=True,
              help="Resume runs of this workflow here after an input or a fork (repeatable).")
@click.option("--max-body", type=click.IntRange(min=1), default=1 << 20, show_default=True,
              metavar="BYTES",
              help="Largest request body accepted (an input's payload); larger is 413.")
@click.option("--json", "as_json", is_flag=True,
              help="Announce the address as one JSON line (for scripts that start it).")
@logging_options
def ui(store_url: str | None, host: str, port: int, tokens: tuple[str, ...], read_only: bool,
       specs: tuple[str, ...], max_body: int, as_json: bool, verbose: int, quiet: bool,
       log_level: str | None) -> None:
    """Serve the web inspector and approval inbox (needs pip install 'pitstop[ui]')."""
    root = click.get_current_context().find_root().obj or {}
    configure_logging(log_level or root.get("log_level"), default="WARNING",
                      verbose=verbose + root.get("verbose", 0),
                      quiet=quiet or root.get("quiet", False))
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401

        from pitstop.ui.security import parse_tokens
        from pitstop.ui.server import check_exposure, serve
    except ImportError as exc:
        raise CliError(f"the inspector needs the ui extra: pip install 'pitstop[ui]' ({exc})"
                       ) from None
    try:
        check_exposure(host, parse_tokens(tokens))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    workflows = [load_workflow(spec) for spec in specs]
    session = Session(store_url or root.get("store"), as_json=False)
    try:
        serve(session.store(), host=host, port=port, token=tokens, read_only=read_only,
              workflows=workflows, announce="json" if as_json else "text",
              max_body=max_body)
    finally:
        session.close()


__all__ = ["ui"]
