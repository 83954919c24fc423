"""Print the settings table of docs/configuration.md (tests/server/test_config.py checks
that the document holds exactly these rows).

    python tools/config_table.py
"""
from tryll_fast.server.config import settings_table

if __name__ == "__main__":
    print(settings_table())
