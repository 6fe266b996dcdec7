"""`python -m gasless.cli ...` runs the `gasless` command."""

from gasless.cli import main

main()
