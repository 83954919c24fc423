"""llama.cpp's process-wide backend: loaded and initialised once, before the first model,
embedding model or device query (model.py, embeddings.py and devices.py all need it, and
none of them needs the others for it)."""
import logging
import threading

import llama_cpp.llama_cpp as C

_lock = threading.Lock()
_ready = False


def init_backend() -> None:
    """Load and initialise llama.cpp's backends once per process (idempotent)."""
    global _ready
    with _lock:
        if _ready:
            return
        C.llama_backend_init()
        # llama-cpp-python installs a Python log callback that prints every
        # INFO line of every model load; keep errors only unless someone asked.
        log = logging.getLogger("llama-cpp-python")
        if log.level == logging.NOTSET:
            log.setLevel(logging.ERROR)
        _ready = True
