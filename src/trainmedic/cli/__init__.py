"""The command-line interface: one module per command."""
