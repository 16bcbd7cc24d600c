"""The project's own exceptions.

Every failure a user or sysadmin can cause maps to one of these, so the command line can print
one clear line and choose a meaningful exit code instead of a traceback.
"""

from __future__ import annotations


class WattclassError(Exception):
    """Base class; ``exit_code`` is what ``wattclass`` exits with when this escapes a command."""

    exit_code = 1


class ConfigError(WattclassError):
    """A configuration file or option is invalid; the message names the file and the key."""

    exit_code = 2


class DataError(WattclassError):
    """Input data is unusable (missing column, corrupt file); the message names the file/column."""

    exit_code = 3


class GpuError(WattclassError):
    """A GPU backend call failed."""

    exit_code = 4


class GpuInitError(GpuError):
    """The GPU library (NVML) cannot start at all: no driver, no library, no permission."""


class GpuLostError(GpuError):
    """One GPU stopped answering (fallen off the bus, timeout); others may still work."""


class GpuNotSupportedError(GpuError):
    """The GPU does not support this query or setting."""


class GpuPermissionError(GpuError):
    """The caller lacks the privilege for this call (setting a power limit needs root)."""


class SlurmError(WattclassError):
    """A Slurm command failed or returned output that could not be parsed."""

    exit_code = 5


class LockBusyError(WattclassError):
    """Another process holds the folder lock (a second daemon, a second nightly run)."""

    exit_code = 6


class NoDataError(WattclassError):
    """A run found nothing to work on where data was expected (a day without telemetry)."""

    exit_code = 7
