import sys

from fleetsieve_bayes.cli import main

sys.exit(main())
