"""``python -m trainmedic`` runs the command line."""

import sys

from trainmedic.cli.main import main

sys.exit(main())
