"""``pitstop ui``: a web inspector and approval inbox for a pitstop store.

``pip install 'pitstop[ui]'``, then ``pitstop ui --store URL``, or mount the app in a service
of your own::

    from pitstop.ui import create_app
    app.mount("/pitstop", create_app(store, token=os.environ["PITSTOP_UI_TOKEN"]))

Pages: the runs (filters, counts, live updates), the inbox of runs waiting for an input, one
run (its checkpoint tree, each checkpoint's state, diffs, inputs and effects) and its
actions (send an input, cancel, fork with edited fields, resume). The JSON API the pages use
is documented at ``/openapi.json``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        try:
            from .app import create_app
        except ImportError as exc:  # the extra is not installed
            raise ImportError(
                f"the inspector needs the ui extra: pip install 'pitstop[ui]' ({exc})"
            ) from exc
        return create_app
    raise AttributeError(f"module 'pitstop.ui' has no attribute {name!r}")


__all__ = ["create_app"]
