"""What a command exits with, and the errors that keep it from opening the data dir."""

from __future__ import annotations

from tensor_debugger.errors import DatabaseSettingError, DatabaseUnavailableError, StoreUnavailableError

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
EXIT_READER_GONE = 128 + 13  # as a tool that SIGPIPE ends exits: its output's reader left (`| head`)
EXIT_INTERRUPTED = 128 + 2  # as a tool that SIGINT ends exits: the user pressed Ctrl-C
# what keeps a command from opening the data dir's database and store: said in one line, exit 2
UNOPENED = (StoreUnavailableError, DatabaseSettingError, DatabaseUnavailableError)
