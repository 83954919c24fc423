"""tryll_fast: a local server that gives game characters a mind (and, next, a voice).

Packages (the tree is the architecture; docs/architecture.md draws it):
  codec/      the FlatBuffers frame codec of wire protocol v29 (compiled)
  transport/  the epoll reactor: sockets, frames, backpressure (compiled)
  server/     sessions, dispatch by message type, the request handlers, config, logs
  workflow/   agents: graphs, turns, nodes, variables, dialogs, projection, token streaming
  prompting/  chat templates and tool-call prompts, grammars and parsing (engine-neutral)
  engines/    the engine roles and registry; llama/ runs language and embedding models
  models/     the model catalog, fetching model files, loading them with reference counts
  client/     the Python client, blocking and asyncio
  errors/     the protocol's error codes, one exception class per code
  cli.py      the `tryll-fast` command
"""

PROTOCOL_VERSION = 29
__version__ = "0.1.0"
