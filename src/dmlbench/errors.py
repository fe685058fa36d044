"""Errors a user can cause, and the interruption of a run; the CLI turns each into one line on stderr."""

import re


class UserInputError(ValueError):
    """Bad configuration, data, path or hyper-parameter (exit 2). A parameter the message names, as the
    Python caller passes it, is in backticks (```resume` continues it``); the command line shows it as
    the option that gives it (``--resume``): ``as_options``."""

    def as_options(self) -> str:
        """The message as the command line shows it: every parameter it names written as its option."""
        return _NAMED.sub(lambda named: option(named[1]), str(self))


class ParameterError(UserInputError):
    """A bad value of one parameter, named as the Python caller passes it (``fmr must be ...``, as
    scikit-learn names its parameters: the function's own, or for a parser of an option's text the
    option's); other parameters the message names are in backticks (``give `calibration` FILE``).
    The command line shows each as the option that gives it (``--fmr``, ``--calibration``):
    ``as_options``."""

    def __init__(self, parameter: str, detail: str) -> None:
        super().__init__(f"{parameter} {detail}")
        self.parameter, self.detail = parameter, detail

    def as_options(self) -> str:
        """The message with every parameter it names written as its command-line option."""
        return f"{option(self.parameter)} {_NAMED.sub(lambda named: option(named[1]), self.detail)}"


_NAMED = re.compile(r"`(\w+)`")


def option(parameter: str) -> str:
    """The command-line option of a parameter: ``test_embeddings`` -> ``--test-embeddings``."""
    return "--" + parameter.replace("_", "-")


class RunInterrupted(Exception):
    """A run was stopped (Ctrl-C) after its last checkpoint; the message says how to resume it (exit 130).

    Deliberately not a ``KeyboardInterrupt``: the CLI library would turn that into a silent exit.
    """


class StorageFailed(Exception):
    """The disk or the database failed, not the work: a write failed for lack of space, an exceeded
    quota or an I/O error, or the database stayed away past the retry bound. The run or unit is left
    ``interrupted`` (never ``failed``); the message names the path or URL and how to continue (exit 1)."""


class PluginFailed(RuntimeError):
    """A plugin's code raised while a run used it: the message is one line naming the plugin, the
    exception and its last frame in the plugin; the run is marked ``failed`` and its ``error.log``
    holds the full traceback (exit 1)."""
