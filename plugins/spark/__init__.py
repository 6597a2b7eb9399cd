"""The spark plugin: stream queues with offsets and cursors, and a PySpark data source."""
