"""Errors of the scenario layer: bad datasets and failed calls to chat endpoints."""

from __future__ import annotations

from clawrl.errors import ClawrlError


class DatasetError(ClawrlError):
    """A problem file could not be read or a line is not a valid GSM8K record.

    Attributes:
        path: the file.
        line: the 1-based line number, when one line is at fault.
    """

    def __init__(self, message: str, *, path: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


class ChatEndpointError(ClawrlError):
    """A call to an OpenAI-compatible endpoint (the gateway, or an LLM user's) failed.

    Attributes:
        url: the URL called.
        status: the HTTP status, or ``None`` for a connection error or a timeout.
    """

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
