"""The ``appliance`` command: every subcommand's arguments and ``main`` (``main.py`` dispatches by name).

The top of the import graph: a command may import any room below it.  Nothing outside this package parses a
command line, except ``bench.cli`` (the ``appliance bench`` subcommand, dispatched to by name so that nothing
imports ``bench``).
"""
