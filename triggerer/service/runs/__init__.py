"""Running a pipeline: the launcher that claims queued runs, the processes it starts (the runner,
the run forker, the local Spark Connect server) and what they need: the run's spec, its inlet
events, its log shipped into the store, its OpenLineage events."""
