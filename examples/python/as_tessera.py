#!/usr/bin/env python3
"""Runs a PyTorch script on Tessera, unedited: `torch`, `torch.nn`, `torch.nn.functional` and
`torch.optim` (and their submodules) are pointed at tessera's modules before the script imports
them.

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
# The other submodules too (torch.optim.lr_scheduler, torch.nn.init, torch.utils.data ...), so
# that `from torch.optim.lr_scheduler import StepLR` finds tessera's module rather than a copy.
for _name, _module in list(sys.modules.items()):
    if _name.startswith(("tessera.nn.", "tessera.optim.", "tessera.utils", "tessera.amp")):
        sys.modules.setdefault("torch" + _name[len("tessera"):], _module)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: as_tessera.py SCRIPT [ARGS...]")
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
