"""What carries data from older places into the catalog: legacy index files of
tfd-utils, MXNet/DALI and vahidk (:mod:`.legacy`)."""
