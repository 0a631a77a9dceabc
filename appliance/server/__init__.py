"""The service's processes: the supervisor (``appliance serve``), its children, the partition writers, the
topic metadata store, sd_notify and process titles.

Imports ``config`` and the packages below ``appliance``; never ``client`` or ``cli``.  The supervisor starts
the broker and the replica children by name (``EXTRA_CHILDREN``), so it imports neither. """
