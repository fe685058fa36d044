"""Reading a stored study back without running it: ``status`` (what is done, running, failed) and
``audit`` (whether the protocol was kept: test access, folds, budgets)."""
