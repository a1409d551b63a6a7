"""``python -m pitstop``: the same as the ``pitstop`` command."""

from pitstop.cli import main

if __name__ == "__main__":
    main()
