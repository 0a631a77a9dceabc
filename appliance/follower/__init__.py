"""The replica process (``appliance replica``): one fetcher per partition of a leader, promotable to leader,
and how it finds the leader.  The fetchers themselves are ``replicas``.

Imports ``config``, ``server``, ``cleaner`` (the replica's cleaner thread shares its choice, throttle and
pass) and the packages below ``appliance``; never ``client`` or ``cli``.
"""
