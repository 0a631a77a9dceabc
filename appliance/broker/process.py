"""The broker as a process: its main (:func:`run_broker`) and the supervisor's hook (:func:`child_spec`).

``appliance serve`` names :func:`child_spec` in ``appliance.server.children.EXTRA_CHILDREN``: the supervisor
forks the broker after the partition writers, restarts it if it dies, and waits for it (its listeners
bound) before READY=1.  The child (:func:`broker_child`) reaches the supervisor through one control
connection for its whole life (``appliance.broker.control_cluster``, imported in the broker process only:
the supervisor imports before its forks only what its children share) and serves until SIGTERM.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from appliance.broker.broker import Broker
from appliance.broker.cluster import Cluster
from appliance.config.server_config import Config
from appliance.server.children import ChildContext, ChildSpec
from appliance.server.proctitle import set_proctitle
from storage.errors import ConfigError

__all__ = ["broker_child", "child_spec", "run_broker"]

CONTROL_TIMEOUT_S = 5.0  # a control call blocks the loop: never longer than this

log = logging.getLogger("appliance.broker")


def run_broker(
    config: Config,
    cluster: Cluster | None = None,
    *,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    stop_on_sigint: bool = True,
    wake_fd: int = -1,
) -> int:
    """The broker process's main: bind, serve until SIGTERM (and SIGINT), return the exit code.

    ``cluster`` defaults to a new connection to the supervisor's control socket.  ``on_ready`` is called
    with the bound addresses once every listener is open; ``wake_fd`` is the writers' wake-up eventfd
    (:class:`~appliance.broker.broker.Broker`).  The process title is "appliance: broker"."""
    set_proctitle("appliance: broker")
    if cluster is None:
        from appliance.broker.control_cluster import ControlCluster  # the broker process's import only

        cluster = ControlCluster.connect(config)
    broker = Broker(config, cluster, wake_fd=wake_fd)
    signal.signal(signal.SIGTERM, lambda *_: broker.stop())
    if stop_on_sigint:
        signal.signal(signal.SIGINT, lambda *_: broker.stop())
    try:
        addresses = broker.bind()
    except BaseException:
        broker.close()
        raise
    if on_ready is not None:
        on_ready(dict(addresses))
    broker.serve()
    log.info("broker stopped")
    return 0


def child_spec(config: Config) -> ChildSpec:
    """The supervisor's hook (``EXTRA_CHILDREN``): the broker as a child process, forked after the partition
    writers, restarted if it dies; READY=1 waits until its listeners are bound."""
    return ChildSpec(name="broker", target=broker_child, title="appliance: broker", wait_ready=True)


def broker_child(context: ChildContext) -> int:
    """Body of the broker child.  The supervisor has set the title, the parent-death signal and SIGINT
    ignored (it stops its children with SIGTERM)."""
    from appliance.broker.control_cluster import ControlCluster  # the broker process's import only

    config = context.config
    try:
        cluster = ControlCluster(context.connect(timeout_s=CONTROL_TIMEOUT_S),
                                 reconnect=lambda: context.connect(timeout_s=CONTROL_TIMEOUT_S))
        return run_broker(config, cluster, on_ready=lambda _: context.ready(), stop_on_sigint=False,
                          wake_fd=context.broker_wake_fd)
    except ConfigError as e:
        log.error("broker not started: %s", e)
        return 1
