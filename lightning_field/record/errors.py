"""The record configuration's error, apart from both its users: ``config`` parses the configuration
with the checks ``conditions`` defines, and each check validates its own parameters, so neither
module has to import the other inside a function to raise it."""


class RecordConfigError(ValueError):
    """The record configuration cannot be used; the message names the key."""
