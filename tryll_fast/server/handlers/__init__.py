"""One module per feature area; importing this package registers every handler."""
from tryll_fast.server.handlers import agents, debug, models, pending, session  # noqa: F401
