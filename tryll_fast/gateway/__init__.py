"""The gateway: the pipeline transport, a second front door beside the TCP protocol
(docs/pipeline.md).

Owns the pipeline's HTTP server (app.py: aiohttp with python-socketio, on its own thread
and loop: the WebSocket endpoint `/pipeline` and Socket.IO's `/socket.io/`), the element
codec (elements.py: TEXT, JSON and MSGPACK), the connection parameters (params.py), the
pipeline config of named agents and action mappers (config.py, with tables.py turning TOML
tables into the codec's tables), raw audio's formats (audio.py), and the glue of one
connection (connection.py: turns, the voice input behind raw audio, barge-in, the stall
limit).

It must not run turns, touch agents or engines directly, or decide anything the TCP
protocol decides: a pipeline connection is a client of an ordinary server Session, which
it drives with the protocol's own requests (CreateSession, CreateAgent, SendMessage,
UpdateAgentVariables, CreateVoiceInput and the utterance messages, Cancel, DebugCommand)
and whose frames it turns into elements. So both front doors share
the agents, the engines, the workflow and the voice, and their rules.
"""
from tryll_fast.gateway.app import Gateway
from tryll_fast.gateway.config import PipelineConfig, load_pipeline_config

__all__ = ["Gateway", "PipelineConfig", "load_pipeline_config"]
