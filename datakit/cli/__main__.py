"""`python -m datakit.cli ...` is the `datakit` command."""
from datakit.cli import command

command()
