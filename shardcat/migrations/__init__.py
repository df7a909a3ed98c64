"""What carries data from older places into the catalog: the catalog's own schema
steps from older versions (:mod:`.schema`), and legacy index files of tfd-utils,
MXNet/DALI and vahidk (:mod:`.legacy`)."""
