import sys

from kvplan.schemas.generate import main

sys.exit(main(sys.argv[1:]))
