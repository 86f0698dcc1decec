"""What runs INSIDE the sandbox: the session kernel and the sandcell_guest helper.

The runtime binds this directory read-only at /opt/sandcell (GUEST_PACKAGE_DIR) of each
image's root, on the host (runtime/guest_mounts.py). A session's kernel runs it as the package
`sandcell` of the sandbox's own interpreter (`from sandcell.kernel import main`, stdlib and
IPython only); jobs import `sandcell_guest` from it (stdlib only). Nothing here may import the
rest of sandcell (import-linter checks that): none of it exists in the sandbox. Keep this file
import-free.
"""
