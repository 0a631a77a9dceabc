"""The cleaner room: the log cleaner as a child process of the supervisor (``appliance.cleaner.process``)."""

__all__: list[str] = []
