"""Inference engines: the code that runs models on this machine.

Owns: loading model files into memory, running them (llama.cpp for language
models in `llama/`; speech engines arrive later), the KV cache and its
sharing between agents, and the accounting of what that memory costs. It
knows nothing about sockets, frames, sessions or workflow graphs: callers hand
it token ids or text and get text back through handles and queues.
"""
