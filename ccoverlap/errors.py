"""Errors that end a command with one clear line instead of a traceback."""


class CCOverlapError(Exception):
    """Base of every error ccoverlap reports to a user in one line."""


class ConfigError(CCOverlapError, ValueError):
    """A model, cluster, parallelism or config file that cannot be used (CLI exit 2)."""


class TraceError(CCOverlapError):
    """A profiler trace that cannot be read (names the file and the problem)."""
