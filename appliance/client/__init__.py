"""The client library: :class:`Producer` (local rings or TCP), :class:`Consumer` (local memory maps or TCP)
and the Kafka admin client.  Its public names are re-exported by ``appliance``.

Imports ``config`` and the packages below ``appliance``; never ``server``, ``broker``, ``follower`` or
``cli``. """
