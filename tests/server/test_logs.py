"""Structured logs: one line per event in both formats, fields kept, exceptions inline."""
import io
import json
import logging

import pytest

from tryll_fast.server.logs import configure_logging, fields


@pytest.fixture
def emit():
    def run(fmt):
        out = io.StringIO()
        handler = configure_logging("debug", fmt, out)
        log = logging.getLogger("tryll_fast.test")
        log.info("listening", extra=fields(host="127.0.0.1", port=9100, models=["a", "b"],
                                           note='say "hi"', ok=True))
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed", extra=fields(session=3))
        logging.getLogger("tryll_fast").removeHandler(handler)
        return out.getvalue().splitlines()
    return run


def test_text_lines_are_key_value(emit):
    first, second = emit("text")
    assert "level=info logger=tryll_fast.test msg=listening host=127.0.0.1 port=9100" in first
    assert "models=[a,b]" in first and 'note="say \\"hi\\""' in first and "ok=true" in first
    assert second.startswith("ts=") and "msg=failed session=3 exc=" in second
    assert "ValueError: boom" in second


def test_json_lines_parse(emit):
    first, second = (json.loads(line) for line in emit("json"))
    assert first["msg"] == "listening" and first["port"] == 9100 and first["models"] == ["a", "b"]
    assert first["level"] == "info" and first["ts"].endswith("Z")
    assert second["session"] == 3 and "ValueError: boom" in second["exc"]
