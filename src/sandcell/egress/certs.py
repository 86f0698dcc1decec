"""The per-job certificate authority the proxy uses to terminate TLS for secret-bearing hosts.

Every job gets a fresh CA, so a certificate minted for one job is worthless in any other. The CA
carries a critical name constraint listing exactly the hosts the job has secrets for: even a
client that trusted this CA could not be shown a valid certificate for any other name. Keys never
touch the disk: `ssl` loads certificate chains only from paths, so they go through an anonymous
in-memory file (`memfd_create`) that is closed right after loading.
"""

import datetime
import os
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_SKEW = datetime.timedelta(hours=1)  # tolerate a sandbox clock slightly behind the host's


@dataclass(frozen=True)
class _Leaf:
    chain_pem: bytes  # leaf then CA certificate
    key_pem: bytes


class JobCertificateAuthority:
    """A CA for one job, minting (and caching) one server certificate per intercepted host."""

    def __init__(self, hosts: Iterable[str], label: str = "job", lifetime_s: float = 7 * 86400):
        self.hosts = frozenset(hosts)
        if not self.hosts:
            raise ValueError("a job CA is only needed for hosts that carry secrets")
        now = datetime.datetime.now(datetime.UTC)
        self._not_before = now - _SKEW
        self._not_after = now + datetime.timedelta(seconds=lifetime_s)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())  # one key per job, per-host certs
        self._cert = self._build_ca(label)
        self.cert_pem: bytes = self._cert.public_bytes(serialization.Encoding.PEM)
        self._contexts: dict[str, ssl.SSLContext] = {}  # per host, certificate loaded

    def _build_ca(self, label: str) -> x509.Certificate:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"sandcell egress CA {label}")])
        public = self._key.public_key()
        permitted = [x509.DNSName(h) for h in sorted(self.hosts)]
        constraints = x509.NameConstraints(permitted_subtrees=permitted, excluded_subtrees=None)
        return (
            self._builder(name, name, public)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(constraints, critical=True)
            .sign(self._key, hashes.SHA256())
        )

    def _builder(
        self, subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        )

    def _mint(self, host: str) -> _Leaf:
        public = self._leaf_key.public_key()
        ca_ski = self._cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        cert = (
            self._builder(_cn(host), self._cert.subject, public)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = self._leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return _Leaf(cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem, key_pem)

    def server_context(self, host: str, on_sni: Callable[[str | None], bool]) -> ssl.SSLContext:
        """A TLS server context for one connection that presents `host`'s certificate.

        `on_sni` sees the client's server name (None if it sent none) and returns whether to go
        on; refusing aborts the handshake with an `unrecognized_name` alert. The returned context
        is a cheap certificate-less front, fresh per connection so the SNI decision stays tied
        to its connection; on acceptance it switches to the cached context holding the
        certificate (the usual SNI virtual-hosting move).
        """
        with_cert = self._host_context(host)
        front = _tls_server_context()

        def check(obj: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> int | None:
            if not on_sni(name):
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            obj.context = with_cert
            return None

        front.sni_callback = check
        return front

    def _host_context(self, host: str) -> ssl.SSLContext:
        if host not in self.hosts:
            raise ValueError("this CA only signs for the job's secret hosts")
        if host not in self._contexts:
            context = _tls_server_context()
            _load_chain(context, self._mint(host))
            self._contexts[host] = context
        return self._contexts[host]


def _tls_server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # the proxy speaks HTTP/1.1 only
    return context


def _cn(host: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _load_chain(context: ssl.SSLContext, leaf: _Leaf) -> None:
    cert_fd = os.memfd_create("sandcell-egress-cert", os.MFD_CLOEXEC)
    key_fd = os.memfd_create("sandcell-egress-key", os.MFD_CLOEXEC)
    try:
        os.write(cert_fd, leaf.chain_pem)
        os.write(key_fd, leaf.key_pem)
        context.load_cert_chain(f"/proc/self/fd/{cert_fd}", f"/proc/self/fd/{key_fd}")
    finally:
        os.close(cert_fd)
        os.close(key_fd)
