"""The `pfcxl` command: argument parsing and one module per command group over the API.
Nothing below this package imports it."""
