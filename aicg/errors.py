"""Errors that aicg reports to its user: each names where and what was expected."""
from __future__ import annotations


class InputError(ValueError):
    """A declarative input (TOML, profile, hwdb, op request) is wrong.

    The message always names the file, the key inside it, and what was
    expected, so the user can fix the input without reading aicg's code.
    """

    def __init__(self, file: str, key: str, expected: str, found: object = None):
        self.file, self.key, self.expected, self.found = str(file), key, expected, found
        message = f"{self.file}: {key}: expected {expected}"
        if found is not None:
            message += f", found {found!r}"
        super().__init__(message)


class UnknownTarget(InputError):
    """A profile names a target hwdb/ has no entry for (yet: `doit probe` on that GPU writes one)."""


class CompileError(RuntimeError):
    """NVRTC rejected a generated kernel; the message carries its log."""


class InputChanged(RuntimeError):
    """An input of a step changed while the step ran; its result is not published."""


class DeviceError(RuntimeError):
    """A CUDA driver call failed."""
