"""Errors a user can cause. The CLI turns each into one line on stderr and exit code 2."""


class UserInputError(ValueError):
    """Bad configuration, data, path or hyper-parameter; the message is shown to the user as is."""
