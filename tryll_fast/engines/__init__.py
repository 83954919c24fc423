"""Inference engines: the code that runs models on this machine.

Owns: the engine roles (roles.py: what the workflow may ask of a language model, an
embedding model, a speech synthesiser or recogniser, a voice activity detector), the
registry of the engines this build runs (registry.py), their errors (errors.py), and the
engines themselves: llama/ (llama.cpp: language and embedding models, batched across
agents, KV prefixes shared). Engines know nothing about sockets, frames, sessions or
workflow graphs: callers hand them token ids or text and get text back through handles.
"""
