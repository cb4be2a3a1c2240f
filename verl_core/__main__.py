import sys

from verl_core.cli import main

sys.exit(main())
