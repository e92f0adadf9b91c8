"""The ``llmgw`` command line (click). One module per command group."""
