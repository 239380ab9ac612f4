"""``python -m kvembed.cli``: the ``kvembed`` program."""

from .main import main

main()
