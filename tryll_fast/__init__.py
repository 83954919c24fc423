"""tryll_fast: a local server that gives game characters a mind and a voice.

Packages (the tree is the architecture):
  codec/      FlatBuffers frame codec for wire protocol v29 (compiled)
  engines/    inference engines: llama/ (batched llama.cpp, shared KV prefixes,
              chat templates, tool calls, embeddings)
  models/     the model catalog and fetching model files
  cli.py      the `tryll-fast` command
"""

PROTOCOL_VERSION = 29
__version__ = "0.1.0"
