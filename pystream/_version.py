"""The package's version: its one definition. pyproject.toml reads it for
the distribution's metadata, conda/meta.yaml for the recipe; modules import
it from here rather than from the package, whose __init__ imports them."""

__version__ = "0.1.0"
