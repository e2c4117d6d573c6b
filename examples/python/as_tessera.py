#!/usr/bin/env python3
"""Runs a PyTorch script on Tessera, unedited: `torch`, `torch.nn`, `torch.nn.functional` and
`torch.optim` are pointed at tessera's modules before the script imports them.

    build/pyvenv/bin/python examples/python/as_tessera.py SCRIPT [ARGS...]
"""
import runpy
import sys

import tessera
import tessera.nn
import tessera.nn.functional
import tessera.optim

sys.modules["torch"] = tessera
sys.modules["torch.nn"] = tessera.nn
sys.modules["torch.nn.functional"] = tessera.nn.functional
sys.modules["torch.optim"] = tessera.optim

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: as_tessera.py SCRIPT [ARGS...]")
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
