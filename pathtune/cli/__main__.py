"""``python -m pathtune.cli`` is the ``pathtune`` command."""
from pathtune.cli import main

if __name__ == "__main__":
    main()
