"""``appliance version`` (and ``appliance --version``): the appliance's version and the Kafka protocol it
speaks, one line per API in ``kafka-broker-api-versions.sh``'s shape::

    appliance 0.1.0
    Kafka protocol (the versions the broker advertises in ApiVersions):
      Produce(0): 3 to 9
      Fetch(1): 4 to 12
      ...
"""

from __future__ import annotations

import sys
from importlib import metadata

from ipc.kafka.apis import ApiKey, supported_api_versions

__all__ = ["main", "version_lines"]

_DISTRIBUTION = "log-appliance"


def version_lines() -> list[str]:
    """The lines ``appliance version`` prints."""
    try:
        version = metadata.version(_DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "unknown (not installed)"
    lines = [f"appliance {version}", "Kafka protocol (the versions the broker advertises in ApiVersions):"]
    for api in supported_api_versions():
        name = "".join(word.capitalize() for word in ApiKey(api.api_key).name.split("_"))
        lines.append(f"  {name}({api.api_key}): {api.min_version} to {api.max_version}")
    return lines


def main(argv: list[str]) -> int:
    """``appliance version``; takes no arguments."""
    if argv:
        print(f"appliance version: takes no arguments, got {' '.join(argv)}", file=sys.stderr)
        return 2
    print("\n".join(version_lines()))
    return 0
