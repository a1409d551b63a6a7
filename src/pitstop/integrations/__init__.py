"""Integrations of pitstop stores with other frameworks.

Each integration lives in its own module and imports its framework lazily, so installing
pitstop never requires them: ``pitstop.integrations.langgraph`` needs ``pitstop[langgraph]``.
"""
