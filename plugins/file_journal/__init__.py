"""The file journal: an append-only record journal on fixed-size, recycled files.

It stores records (a 64-bit id, a small type, bytes) and knows nothing about messages.
See `journal` for the threads and the reclaim bookkeeping, `format` for the bytes on
disk, `compactor` for compaction and its crash safety, `tools` for the CLI helpers.
"""

from .compactor import STAGES as COMPACTION_STAGES
from .compactor import ControlFileError
from .errors import JournalError
from .journal import FileJournal
from .settings import JournalSettings
from .tools import RecordView, compact_offline, iter_records, measure_sync_rate
from .writer import JournalCounters

__all__ = [
    "COMPACTION_STAGES",
    "ControlFileError",
    "FileJournal",
    "JournalCounters",
    "JournalError",
    "JournalSettings",
    "RecordView",
    "compact_offline",
    "iter_records",
    "measure_sync_rate",
]
