"""``python -m pystream.cli``."""

from pystream.cli import main

raise SystemExit(main())
