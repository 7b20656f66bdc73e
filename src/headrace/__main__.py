"""``python -m headrace``: the same entry point as the ``headrace`` command."""

from headrace.cli import main

if __name__ == "__main__":
    main()
