"""The running half: the fair protocol of seed 001 §3, in rooms by what they do.

``design`` (what a study is: the benchmark file, search spaces, folds, method plans, ``prepare``) ->
``queue`` (the storage and the claims on it: slots, attempts, heartbeats) -> ``units`` (the kinds of
work: search trials and their fold runs, reproductions, the baseline, scoring the test split) ->
``run`` (stages, the scheduler, the workers and the records a study writes) -> ``dry_run`` (timing a
design on a rehearsal) and ``inspection`` (status and audit of a stored study). ``layout`` names the
files and folders of a benchmark directory for all of them.
"""
