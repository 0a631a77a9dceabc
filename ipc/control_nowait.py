"""The control client's non-blocking mode: requests sent without waiting, their replies matched by id later.

Theory of operation
-------------------
Every request a :class:`~ipc.control.ControlClient` sends carries an ``"id"`` and its reply the same
``"id"`` (``ipc.control_protocol``); the supervisor answers a connection's later requests while an earlier
one is still being worked on.  So one connection can carry both kinds of call:

- a *blocking* call (:meth:`ControlClient.request`) sends, then reads the socket until the reply with its id
  comes;
- a *non-blocking* call (:meth:`ControlClient.send`) sends and returns the request's id at once; the caller
  says what to do with the reply (a callback, :data:`Reply`), and :meth:`ControlClient.read`, called when
  the socket is readable (an event loop's selector), takes what arrived without blocking and answers.

:class:`OwedReplies` is the book of the non-blocking calls not answered yet.  A reply is *taken* (matched by
id, queued) wherever it is read -- by :meth:`ControlClient.read`, or by a blocking call that read it while
waiting for its own -- and *delivered* (its callback called) only by :meth:`OwedReplies.deliver`, from
:meth:`ControlClient.read`: never inside a blocking call, so a callback never runs in the middle of its
caller's other work.  The owner tells that something waits for delivery by :attr:`OwedReplies.arrived`
(the socket may not be readable any more: a blocking call read the bytes).  A reply whose id is owed
neither to a blocking nor to a non-blocking call (its caller gave up: :meth:`OwedReplies.forget`) is dropped
and counted.  When the connection is lost every call still owed is answered with the
:class:`~ipc.control_protocol.ControlError` (BROKER_NOT_AVAILABLE) that says so
(:meth:`OwedReplies.fail_all`): the operation may or may not have happened in the supervisor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ipc.control_protocol import ControlError, raise_for_error

__all__ = ["OwedReplies", "Reply"]

# the successful reply, or what a failed one (or the lost connection) raises
Reply = Callable[[dict[str, Any] | ControlError], None]


class OwedReplies:
    """The non-blocking requests sent and not answered yet, by id; replies taken, waiting for delivery."""

    def __init__(self) -> None:
        self._owed: dict[int, Reply] = {}
        self._arrived: list[tuple[Reply, dict[str, Any] | ControlError]] = []

    def __len__(self) -> int:
        """Requests owed a reply (sent, not answered, not forgotten)."""
        return len(self._owed)

    @property
    def arrived(self) -> int:
        """Replies taken and not delivered yet."""
        return len(self._arrived)

    def owe(self, request_id: int, on_reply: Reply) -> None:
        self._owed[request_id] = on_reply

    def forget(self, request_id: int) -> None:
        """Stop waiting for a request's reply: it is dropped when it comes."""
        self._owed.pop(request_id, None)

    def take(self, reply: dict[str, Any]) -> bool:
        """Queue ``reply`` for its callback if its id is owed; False if it is not (someone else's)."""
        request_id = reply.get("id")
        on_reply = self._owed.pop(request_id, None) if isinstance(request_id, int) else None
        if on_reply is None:
            return False
        try:
            raise_for_error(reply)
        except ControlError as e:
            self._arrived.append((on_reply, e))
            return True
        self._arrived.append((on_reply, reply))
        return True

    def fail_all(self, error: ControlError) -> None:
        """The connection is lost: every request owed is answered with ``error``."""
        owed, self._owed = self._owed, {}
        self._arrived += [(on_reply, error) for on_reply in owed.values()]

    def deliver(self) -> int:
        """Call the callbacks of the replies taken, in the order they came; how many."""
        arrived, self._arrived = self._arrived, []
        for on_reply, reply in arrived:
            on_reply(reply)
        return len(arrived)
