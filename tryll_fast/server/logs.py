"""Structured logs: one line per event, `key=value` (text) or one JSON object (json).

Code logs with the standard library and passes fields as `extra={"fields": {...}}`:

    log.info("listening", extra={"fields": {"host": host, "port": port}})

renders as `ts=2026-12-01T07:02:13.120Z level=info logger=tryll_fast.server msg=listening
host=127.0.0.1 port=9100`. Values with spaces or quotes are quoted; exceptions go into an
`exc` field so a line stays a line.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def _record_fields(record: logging.LogRecord) -> dict[str, Any]:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    out: dict[str, Any] = {
        "ts": f"{ts}.{int(record.msecs):03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    extra = getattr(record, "fields", None)
    if isinstance(extra, dict):
        out.update(extra)
    if record.exc_info:
        out["exc"] = logging.Formatter().formatException(record.exc_info)
    return out


def _quote(value: Any) -> str:
    if isinstance(value, (list, tuple)):       # [a,b]: one token, readable, greppable
        text = "[" + ",".join(str(v) for v in value) + "]"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, (dict, bool)) or value is None:
        text = json.dumps(value)
    else:
        text = str(value)
    if text == "" or any(c in text for c in ' "=\n\t\\'):
        return json.dumps(text, ensure_ascii=False)
    return text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_quote(v)}" for k, v in _record_fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_record_fields(record), ensure_ascii=False, default=str)


def configure_logging(level: str = "info", fmt: str = "text",
                      stream: TextIO | None = None) -> logging.Handler:
    """Install one handler on the `tryll_fast` logger (replacing an earlier one)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler._tryll = True  # type: ignore[attr-defined]
    root = logging.getLogger("tryll_fast")
    for old in [h for h in root.handlers if getattr(h, "_tryll", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    root.propagate = False
    return handler


def fields(**values: Any) -> dict[str, Any]:
    """`extra=fields(a=1)` reads better than `extra={"fields": {"a": 1}}`."""
    return {"fields": values}
