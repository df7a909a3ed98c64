"""The facade: :class:`~shardcat.facade.catalog.Catalog` (store + formats + sources:
ingest, ``dataset()``, ``verify``, ``migrate``), the ingest driver, the options
every ingest takes, and the path-taking drop-in readers."""
