"""Submit → completed for `print(1)` over HTTP (cold and pooled) against bare python3.11 and a
cold `runsc run`: the `trivial` section of the suite.

    .venv/bin/python -m bench.trivial_job [--quick]   (= sandcell bench --only trivial)
"""

import sys

from bench import suite

if __name__ == "__main__":
    suite.main(["--only", "trivial", *sys.argv[1:]])
