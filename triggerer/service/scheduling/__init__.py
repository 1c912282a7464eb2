"""Scheduling: the registry of what the pipelines folder defines, which queued events a run
consumes (picking), the statements that queue runs, and the loop that turns queued events and
cron ticks into runs. The daemon runs the loop; actions and replay use the same parts."""
