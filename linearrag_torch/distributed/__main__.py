"""The torchrun entry point of the sharded engine:
``torchrun --nproc-per-node N -m linearrag_torch.distributed INDEX_DIR QUESTION ...`` (the arguments of
`linearrag query`; the command line's part: cli/torchrun.py)."""
from __future__ import annotations

from ..cli.torchrun import torchrun_main as main  # an entry point: the one module here that imports the command line

if __name__ == "__main__":
    raise SystemExit(main())
