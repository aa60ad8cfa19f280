import sys

from cpmatrix.cli import main

sys.exit(main())
