"""The ``field`` command line: thin parsing over the library's functions."""
