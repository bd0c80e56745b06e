#!/usr/bin/env python3
"""memsim-record: record the tensor allocations and frees of PyTorch training as a memsim
trace. The recorder itself is tools/python/memsim_record.py (import it as `memsim_record`);
this script puts that folder on sys.path and runs its command line:

    /usr/bin/python3 tools/memsim-record.py --demo OUT.txt [--summary OUT.json]

records two AdamW steps of a small built-in MLP; `memsim replay OUT.txt` replays them.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))

import memsim_record  # noqa: E402

if __name__ == "__main__":
    sys.exit(memsim_record.main())
