"""A small incremental `text/event-stream` parser (the WHATWG rules the client needs).

Lines end in CRLF, LF or CR (a CR at the end of one chunk and an LF at the start of the next are one line
end); `:` starts a comment (keep-alives); `data:` lines are joined with LF; an empty line dispatches the
event; `id:` persists as the last event id (unless it contains NUL); `retry:` sets the reconnection time.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class SSEEvent:
    event: str
    data: str
    id: str | None


class SSEParser:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._pending_cr = False
        self._event = ""
        self._data: list[str] = []
        self._has_data = False
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None
        self._first = True

    def feed(self, chunk: bytes | str) -> list[SSEEvent]:
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        if self._first and text:
            text = text.removeprefix("\ufeff")
            self._first = False
        events: list[SSEEvent] = []
        for line in self._lines(text):
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def _lines(self, text: str) -> list[str]:
        lines: list[str] = []
        i = 0
        if self._pending_cr and text.startswith("\n"):
            i = 1
        self._pending_cr = False
        buffer = self._buffer
        while i < len(text):
            c = text[i]
            if c == "\r":
                lines.append(buffer)
                buffer = ""
                if i + 1 < len(text):
                    if text[i + 1] == "\n":
                        i += 1
                else:
                    self._pending_cr = True
            elif c == "\n":
                lines.append(buffer)
                buffer = ""
            else:
                j = i
                while j < len(text) and text[j] not in "\r\n":
                    j += 1
                buffer += text[i:j]
                i = j
                continue
            i += 1
        self._buffer = buffer
        return lines

    def _line(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isdigit():
                self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._has_data:
            self._event = ""
            return None
        event = SSEEvent(event=self._event or "message", data="\n".join(self._data), id=self.last_event_id)
        self._event, self._data, self._has_data = "", [], False
        return event
