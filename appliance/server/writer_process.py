"""The body of a forked writer process (``appliance: writer TOPIC-N``): title, signals, open, serve, close.

The supervisor forks it after every import (``appliance.server.supervisor``); what the writer does is
``appliance.server.writer``.  SIGINT is ignored (Ctrl-C reaches the whole process group: the supervisor
decides), SIGTERM is a stop.  A writer orphaned by a killed supervisor closes its log without the
clean-shutdown marker (``appliance.server.writer``, "Orphaned").
"""

from __future__ import annotations

import logging
import os
import signal
import socket

from appliance.server.faults import writer_fault_point
from appliance.server.proctitle import set_proctitle
from appliance.server.writer import PartitionWriter
from appliance.server.writer_spec import WriterSpec

__all__ = ["writer_main"]

_log = logging.getLogger("appliance.writer")


def writer_main(spec: WriterSpec, channel: socket.socket) -> int:
    """Body of a forked writer process: title, signals, open, serve, close.  Returns the exit code."""
    set_proctitle(f"appliance: writer {spec.name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor decides
    holder: list[PartitionWriter] = []

    def on_term(signum: int, frame: object) -> None:
        if holder:
            holder[0].request_stop()

    signal.signal(signal.SIGTERM, on_term)
    parent = os.getppid()  # the supervisor (fork_child made sure it is alive and set PR_SET_PDEATHSIG)
    writer = PartitionWriter.open(spec, channel, faults=writer_fault_point(spec.test_faults, spec.directory))
    holder.append(writer)
    try:
        code = writer.run()
    except BaseException:
        _log.exception("writer %s: failed; closing the log uncleanly (the next start recovers it)", spec.name)
        writer.close(clean=False)
        raise
    if os.getppid() != parent:  # orphaned: the supervisor was killed (module docstring, "Orphaned")
        _log.warning("writer %s: the supervisor (pid %d) is gone; closing the log without the clean-shutdown "
                     "marker (the next start checks it as after a crash)", spec.name, parent)  # fmt: skip
        writer.log.flush()
        writer.close(clean=False)
        return code
    writer.close(clean=True)
    return code
