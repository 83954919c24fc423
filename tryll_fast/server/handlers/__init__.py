"""One module per feature area; importing this package registers every handler."""
from tryll_fast.server.handlers import (  # noqa: F401
    agents, debug, dialogs, memory, models, session, storages, voice, voice_input,
)
