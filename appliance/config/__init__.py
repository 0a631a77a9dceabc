"""What every room reads: the appliance's configuration (Kafka's setting names), topic names and settings,
and the topic metadata file's layout.  Imports only the packages below ``appliance``.
"""
