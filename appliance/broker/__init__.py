"""The broker: the Kafka protocol on TCP and a Unix socket, one ``selectors`` loop, its request handlers,
produce into the writers' rings, fetch sessions, the leader's replica state.

Imports ``config``, ``server`` (a child's spec and title) and the packages below ``appliance``; never
``client`` or ``cli``.
"""
