"""``appliance replica`` with one fault point armed to SIGKILL the process there (a test's child).

Usage: ``python faulty_replica.py POINT appliance-arguments...``; POINT is one of
``appliance.follower.adopt_faults.FAULT_POINTS`` or ``storage.clean_faults.FAULT_POINTS`` (the swap's).
"""

from __future__ import annotations

import sys

from appliance.cli.main import main
from appliance.follower.adopt_faults import ADOPT_FAULTS
from storage.clean_faults import CLEAN_FAULTS

if __name__ == "__main__":
    point = sys.argv[1]
    (ADOPT_FAULTS if point.startswith("adopt.") else CLEAN_FAULTS).arm(point, "kill")
    sys.exit(main(sys.argv[2:]))
