"""``python -m dsv4kit``: the ``dsv4kit`` command."""

from dsv4kit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
