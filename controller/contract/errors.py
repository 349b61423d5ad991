"""The error of a configuration a person must fix, apart from serve.config: the command line
catches it without importing pydantic-settings, yaml and the rest of the server's configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration a person must fix; the message names the file and the field."""
