"""``python -m hpo`` = ``verl-hpo``."""

import sys

from hpo._cli import main

sys.exit(main())
