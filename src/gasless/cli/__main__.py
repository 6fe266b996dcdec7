"""`python -m gasless.cli ...` runs the `gasless` command."""

from gasless.cli.main import main

main()
