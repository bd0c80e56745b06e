"""memsim.recorder: the PyTorch allocation recorder, inside the package.

The recorder itself lives in the top-level module `memsim_record` (tools/python/
memsim_record.py, installed beside this package), which tools/memsim-record.py runs; this
module re-exports it. See `memsim.record()` for the short way to use it.
"""
from memsim_record import CATEGORIES, PHASES, Recorder, demo, main  # noqa: F401

__all__ = ["CATEGORIES", "PHASES", "Recorder", "demo", "main"]
