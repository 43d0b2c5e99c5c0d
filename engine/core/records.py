"""Records that runtimes produce and storage keeps: a guest's log lines and the frames
of its backtraces. Plain data, no behaviour: storage imports them from here, never from
a runtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

LogLevel = Literal["trace", "debug", "info", "warn", "error"]
LogStream = Literal["log", "stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line the guest logged (`obelisk:log`, `console.*`) or printed."""

    level: LogLevel
    message: str
    stream: LogStream = "log"
    #: When it was emitted (the engine's clock); None: when it is stored.
    at: datetime | None = None

    def written_at(self, now: datetime) -> datetime:
        """Its timestamp in the log table: when emitted, never after the write."""
        return now if self.at is None or self.at > now else self.at


#: Called from the worker thread for every line as it is produced.
LogSink = Callable[[LogLine], None]


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of a guest stack (for backtraces)."""

    file: str
    line: int
    column: int
    function: str = ""
