"""``python tools/h200_collect``: put ``tools`` on the path so the package imports as h200_collect."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from h200_collect.runner import main

if __name__ == "__main__":
    sys.exit(main(dict(os.environ)))
