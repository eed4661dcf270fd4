"""``python -m examples.flipflop``: see run.py."""
import sys

from .run import main

sys.exit(main())
