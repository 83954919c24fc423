"""The server: sessions, dispatch by union tag, errors, configuration, shutdown.

Owns: what a frame means. A `Session` is the transport's receiver for one connection: it
decodes each frame (codec), routes it by its MessageBody tag to the one handler for that
type (`dispatch.py`, handlers in `handlers/`), and answers with the reply or an
ErrorResponse carrying the request's id. The `Server` wires the reactor, the model manager
and the worker pools together and runs graceful shutdown; `saves.py` keeps the files games
key by save_id under the storage root. It never touches a socket (that is
`tryll_fast.transport`) and never runs a model itself (that is `tryll_fast.engines`).
"""
from tryll_fast.server.config import ConfigError, ServerConfig, load_config
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.server.server import Server

__all__ = ["ConfigError", "ErrorCode", "TryllError", "Server", "ServerConfig", "load_config"]
