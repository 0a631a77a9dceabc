"""The data source Spark sees: format ``"appliance"``, its schema, and which reader or writer a query gets.

``DataSource.__init__`` runs on the driver when the query is defined (``load()``, ``save()``,
``writeStream...start()``) and checks every option (``appliance.spark.options``), so a misspelt option or
malformed offset JSON fails there.  The instance is then pickled to wherever Spark needs a reader or writer:
the parsed options travel with it.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from appliance.spark.options import parse_options
from appliance.spark.schema import read_schema

__all__ = ["FORMAT", "ApplianceDataSource"]

FORMAT = "appliance"  # not "kafka": Spark keeps that name for its own connector (docs/spark.md)


class ApplianceDataSource(DataSource):
    """Topics of a log appliance as a Spark table: Spark's Kafka schema (key, value, topic, partition,
    offset, timestamp, timestampType, and headers with includeHeaders); batch and streaming reads and
    writes."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return read_schema(self.parsed.include_headers)

    # Readers and writers are imported when asked for: the process that only creates the data source (and
    # checks its options) need not import numba and pyarrow.

    def reader(self, schema: StructType) -> DataSourceReader:
        from appliance.spark.batch_reader import ApplianceBatchReader

        return ApplianceBatchReader(self.parsed.for_batch_read())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from appliance.spark.stream_reader import ApplianceStreamReader

        return ApplianceStreamReader(self.parsed.for_stream_read())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from appliance.spark.writer import ApplianceBatchWriter

        return ApplianceBatchWriter(self.parsed.for_write(_types(schema), streaming=False), overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from appliance.spark.writer import ApplianceStreamWriter

        return ApplianceStreamWriter(self.parsed.for_write(_types(schema), streaming=True))


def _types(schema: StructType) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}
