"""Shared fixtures for the test suite.

`make test` runs it in two pytest-xdist workers with ``--dist loadfile``: each test module runs whole in one
worker, so a module's fixtures (most start one `appliance serve` for the whole module) start once.
"""
