"""What every room reads: how settings are declared and parsed, and the appliance's configuration.

``settings`` is the kit every family of settings is declared and parsed with (the server's, the producer's,
the consumer's, the Spark data source's); ``server_settings`` the table of the server's settings;
``listeners`` Kafka's listener syntax; ``server_config`` the resolved ``Config`` and its loading (defaults,
TOML file, ``--override``); ``topic_metadata`` the topic metadata file's layout.  Imports only the packages
below ``appliance``.
"""
