"""What the command line and the web inspector both show, written once: the branch graph's
lanes, a run as JSON, a state's field paths and diffs, sizes, ages and short ids.

Below ``ui`` and ``cli`` in the package chain (neither imports the other's helpers), above
the store and the model it reads from. Nothing here prints or renders HTML: ``cli`` turns
these into characters, ``ui`` into SVG and pages.
"""
