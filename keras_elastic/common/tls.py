"""TLS for a job's gRPC traffic, and which addresses count as loopback.

A job bound to 127.0.0.1 (the default) talks in clear text: nothing leaves the
machine. A job bound beyond loopback (`keras-elastic run --bind`) uses TLS:
the launcher makes a self-signed certificate for the job (`make_self_signed`)
unless the user gives one, and passes the paths to its processes in the
environment (`TLSConfig.to_env`). Servers then serve with the certificate and
key; clients trust only the CA (the self-signed certificate itself).

On a cluster (the Ray backend) services listen on the address of whatever
node they land on, unknown when the certificate is made: a job-made
certificate then also carries the DNS name `JOB_SERVER_NAME`, and clients
check that name rather than the address they dial (`server_name`, gRPC's
`ssl_target_name_override`). Only the job's own certificate is trusted, so
the name proves as much as an address would.

Example:

>>> config = make_self_signed("job/tls", ["10.0.0.5"])
>>> os.environ.update(config.to_env())     # what the launcher gives its processes
>>> TLSConfig.from_env() == config
True
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os

import grpc

TLS_ENV = "KERAS_ELASTIC_TLS"          # "1": TLS on
CERT_ENV = "KERAS_ELASTIC_TLS_CERT"    # servers' certificate chain (PEM)
KEY_ENV = "KERAS_ELASTIC_TLS_KEY"      # servers' private key (PEM)
CA_ENV = "KERAS_ELASTIC_TLS_CA"        # clients' trusted CA (PEM; unset: system's)
INSECURE_ENV = "KERAS_ELASTIC_INSECURE"  # "1": may serve beyond loopback without TLS
# The name clients check instead of the address (job-made certificates on a cluster).
SERVER_NAME_ENV = "KERAS_ELASTIC_TLS_SERVER_NAME"
JOB_SERVER_NAME = "keras-elastic.job"

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only: `localhost` or a loopback address.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve beyond this machine


def is_wildcard(host: str) -> bool:
    """Whether binding `host` listens on every interface (0.0.0.0, ::)."""
    return host in _WILDCARDS


@dataclasses.dataclass(frozen=True)
class TLSConfig:
    """Paths of PEM files. Servers need `cert` and `key`; clients trust `ca`
    (None: the system's root certificates) and, with `server_name`, check that
    the server's certificate carries that name (not the address dialled)."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls) -> TLSConfig | None:
        """The process's TLS settings, or None when TLS is off.

        >>> TLSConfig.from_env() is None        # TLS off
        True
        >>> os.environ.update(make_self_signed("job/tls", []).to_env())
        >>> TLSConfig.from_env()
        TLSConfig(cert='job/tls/cert.pem', key=..., ca=...)
        """
        if os.environ.get(TLS_ENV, "") not in ("1", "true"):
            return None
        return cls(os.environ.get(CERT_ENV) or None, os.environ.get(KEY_ENV) or None,
                   os.environ.get(CA_ENV) or None,
                   os.environ.get(SERVER_NAME_ENV) or None)

    def to_env(self) -> dict[str, str]:
        """The environment variables that give a child process this config."""
        env = {TLS_ENV: "1"}
        for name, value in ((CERT_ENV, self.cert), (KEY_ENV, self.key),
                            (CA_ENV, self.ca), (SERVER_NAME_ENV, self.server_name)):
            if value:
                env[name] = value
        return env

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials to serve with `cert` and `key`."""
        if not (self.cert and self.key):
            raise ValueError(f"TLS is on but a server needs a certificate and a key "
                             f"({CERT_ENV}={self.cert!r}, {KEY_ENV}={self.key!r})")
        return grpc.ssl_server_credentials([(_read(self.key), _read(self.cert))])

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for a client that trusts `ca` only (or the system's CAs)."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca) if self.ca else None)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"cannot read the TLS file {path}: {e.strerror}") from None


def make_self_signed(directory: str, hosts: list[str], days: int = 365,
                     server_name: str | None = None) -> TLSConfig:
    """Makes a self-signed certificate (its own CA) for `hosts` (names or IP
    addresses; `localhost` and 127.0.0.1 are always added) in `directory`:
    `cert.pem`, and `key.pem` readable by its owner only. With `server_name`,
    the certificate also names it and clients check that name (services whose
    addresses are not known yet).

    >>> make_self_signed("job/tls", ["node-3.example.com"])
    TLSConfig(cert='job/tls/cert.pem', key='job/tls/key.pem', ca=...)
    >>> make_self_signed("job/tls", [], server_name=JOB_SERVER_NAME)
    TLSConfig(..., server_name='keras-elastic.job')
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    names: list[x509.GeneralName] = []
    extra = [server_name] if server_name else []
    for host in dict.fromkeys([*hosts, *extra, "localhost", "127.0.0.1"]):
        host = host.strip("[]")
        if is_wildcard(host):
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keras-elastic job")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    os.makedirs(directory, exist_ok=True)
    cert_path = os.path.join(directory, "cert.pem")
    key_path = os.path.join(directory, "key.pem")
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    return TLSConfig(cert=cert_path, key=key_path, ca=cert_path, server_name=server_name)
