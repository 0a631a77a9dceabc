"""How long a fault campaign runs: its short form in ``make test``, its long form in ``make soak``.

A campaign test (``@pytest.mark.campaign``) asks :func:`rounds` how many kills, victims or faults to run;
``make soak`` sets ``APPLIANCE_SOAK=1`` and runs only the campaign tests, each at its long size.  The short
form is the same test, so a campaign that breaks shows up in ``make test`` too, only less often.
"""

from __future__ import annotations

import os

__all__ = ["SOAK", "rounds"]

SOAK = os.environ.get("APPLIANCE_SOAK", "") == "1"


def rounds(short: int, long: int) -> int:
    """``long`` under ``make soak``, else ``short``."""
    return long if SOAK else short
