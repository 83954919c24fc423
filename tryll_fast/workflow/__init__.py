"""The workflow: agents, their graphs, and the turns that walk them.

Owns: compiling a GraphDescription into a Graph (graph.py, every rule checked up front),
the node types (nodes/), an agent's variables (variables.py), dialog (dialog.py) and
per-node projections into prompt tokens (projection.py), Mustache templates
(templates.py), the turn executor (turn.py, with pauses and resumes) on the orchestrator's
event loop (runtime.py), dialog snapshots in TDLG (snapshot.py), the agent KV-cache
lifecycle (kv.py), and the compiled token stream from engine to socket (_stream.pyx).

It uses the engines through their public API (submit / on_text / on_finish / gate) and
the connection only to send frames; sessions, request routing and error replies are the
server's (tryll_fast/server/handlers/agents.py and dialogs.py; files under the storage
root are tryll_fast/server/saves.py).
"""
