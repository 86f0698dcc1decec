"""A session's create → first result and its `1+1` execute round trip over HTTP, beside a
bare-python baseline: the `session` section of the suite.

    .venv/bin/python -m bench.session_http [--quick]   (= sandcell bench --only session)
"""

import sys

from bench import suite

if __name__ == "__main__":
    suite.main(["--only", "session", *sys.argv[1:]])
