"""`python -m entropy_rft.commands.cli`: the console script entropy-rft."""

from . import main

main()
