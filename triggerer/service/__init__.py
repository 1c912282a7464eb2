"""The triggerer program: the daemon, its store, REST API and CLI, and the run-time side of runs.

Nothing here is for pipeline files or triggers to import: they use the SDK at the top of
``triggerer`` (assets, triggers, pipelines, schedules, partitions, context, listeners,
connections). This package may import the SDK; the SDK never imports it.
"""
