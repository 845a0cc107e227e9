import sys

from largebatch.cli import main

sys.exit(main())
