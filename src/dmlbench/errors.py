"""Errors a user can cause, and the interruption of a run; the CLI turns each into one line on stderr."""


class UserInputError(ValueError):
    """Bad configuration, data, path or hyper-parameter; the message is shown to the user as is (exit 2)."""


class RunInterrupted(Exception):
    """A run was stopped (Ctrl-C) after its last checkpoint; the message says how to resume it (exit 130).

    Deliberately not a ``KeyboardInterrupt``: the CLI library would turn that into a silent exit.
    """


class StorageFull(Exception):
    """A write failed for lack of space, an exceeded quota or an I/O error: the run or unit is left
    ``interrupted`` (never ``failed``) and the message names the path and how to continue (exit 1)."""
