"""What runs INSIDE the sandbox: the session kernel (stdlib and IPython only).

The session runtime bind-mounts this directory read-only at /opt/sandcell, where it is the
package `sandcell` of the sandbox's own interpreter. It must never import the rest of sandcell
(import-linter checks that): none of it exists in the sandbox. Keep this file import-free.
"""
