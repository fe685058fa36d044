"""The work queue: the storage every worker shares (``storage``, and ``damaged_storage`` for a file cut
short), which attempt of a slot counts (``attempts``) and how a worker claims, runs and records a slot
(``work``)."""
