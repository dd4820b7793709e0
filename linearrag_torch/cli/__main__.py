"""`python -m linearrag_torch.cli COMMAND ...`: the `linearrag` command."""
import sys

from . import main

sys.exit(main())
