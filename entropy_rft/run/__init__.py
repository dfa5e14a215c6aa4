"""A run's record on disk: its directory, lock and output rule (rundir), the settings digest and the completeness
checks (record), the checkpoint's files, search, load and pruning (checkpoint), and the stops a run obeys (stops)."""
