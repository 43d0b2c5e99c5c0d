"""Executors: lock pending executions and run them (activities), replay them (workflows),
watch timers, drive cancellations and upgrades. They reach guests only through the
runner interfaces of `engine.runtimes.api`."""
