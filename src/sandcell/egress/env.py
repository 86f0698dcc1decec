"""What the worker puts into a sandbox so its programs use the proxy and trust the job CA.

The sandbox gets one CA bundle file: the image's own bundle followed by the job CA. Replacing the
bundle rather than adding a second file is what makes every common client agree, since most of
them read exactly one bundle path from their own variable.
"""

CA_BUNDLE_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL default paths: Python ssl, httpx, aiohttp, urllib, curl (OpenSSL)
    "REQUESTS_CA_BUNDLE",  # requests (ignores SSL_CERT_FILE; uses certifi otherwise)
    "CURL_CA_BUNDLE",  # curl and requests' fallback
    "PIP_CERT",  # pip
    "GIT_SSL_CAINFO",  # git over https
    "AWS_CA_BUNDLE",  # botocore
    "NODE_EXTRA_CA_CERTS",  # node: added to its built-in roots
)


def ca_bundle(image_bundle: bytes, ca_pem: bytes) -> bytes:
    """The image's trusted roots plus the job CA, as one PEM file."""
    separator = b"" if not image_bundle or image_bundle.endswith(b"\n") else b"\n"
    return image_bundle + separator + ca_pem


def sandbox_env(proxy_url: str, ca_bundle_path: str | None = None) -> dict[str, str]:
    """Environment for the sandbox: `proxy_url` is how the sandbox reaches the proxy.

    `ca_bundle_path` is where the worker placed `ca_bundle(...)` inside the sandbox (read-only);
    leave it None for a job without secrets. NO_PROXY is set empty on purpose: nothing bypasses
    the proxy (and nothing could: the sandbox has no other route).
    """
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = proxy_url
    env["NO_PROXY"] = env["no_proxy"] = ""
    if ca_bundle_path is not None:
        env.update(dict.fromkeys(CA_BUNDLE_VARIABLES, ca_bundle_path))
    return env
