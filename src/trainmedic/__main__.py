"""``python -m trainmedic`` runs the command line."""

import sys

from trainmedic._entry import main

sys.exit(main())
