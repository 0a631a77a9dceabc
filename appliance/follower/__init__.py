"""The replica process (``appliance replica``): one fetcher per partition of a leader, promotable to leader,
and how it finds the leader, and the adoption of the leader's cleaned segments.  The fetchers themselves
are ``replicas``.

Imports ``config``, ``server`` and the packages below ``appliance``; never ``client`` or ``cli``.
"""
