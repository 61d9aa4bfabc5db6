"""Certificates for mutual TLS between vipu-server and its clients.

`vipu-server --tls-init` makes a certificate authority and, signed by it, a server certificate
(for the names and addresses clients reach the controller by) and a client certificate:

    vipu-certs/ca/ca.pem, ca-key.pem             the authority; keep its key safe
    vipu-certs/server/ca.pem, server.pem, server-key.pem
    vipu-certs/client/ca.pem, client.pem, client-key.pem

In secure mode both end-points require a client certificate signed by that authority, and
clients check the server's against it. Private keys are written readable by their owner only.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import typing
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vipu.api import credentials, grants
from vipu.api.atomic import write_file
from vipu.model.errors import AlreadyExists, InvalidArgument, PermissionDenied
from vipu.model.times import utc_text

DEFAULT_DIRECTORY = Path("vipu-certs")
DEFAULT_DAYS = 825


AGENT_CERT, AGENT_KEY = "agent.pem", "agent-key.pem"  # in an agent's --tls-dir, with the link's ca.pem
CONTROLLER_CERT, CONTROLLER_KEY = "controller.pem", "controller-key.pem"


@dataclass(frozen=True)
class TlsFiles:
    """Where the files of one TLS set-up live, under one directory."""

    root: Path

    @property
    def server_dir(self) -> Path:
        return self.root / "server"

    @property
    def client_dir(self) -> Path:
        return self.root / "client"

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca" / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca" / "ca-key.pem"

    @property
    def server_cert(self) -> Path:
        return self.server_dir / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.server_dir / "server-key.pem"

    @property
    def client_cert(self) -> Path:
        return self.client_dir / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.client_dir / "client-key.pem"

    def ca_for(self, directory: Path) -> Path:
        return directory / "ca.pem"

    # The link between the controller and its agents has an authority of its own, so that the
    # client certificates users hold (from the authority above) open no agent.

    @property
    def agents_dir(self) -> Path:
        """What each agent needs: its certificate and key, and the link's authority (ca.pem)."""
        return self.root / "agents"

    @property
    def controller_dir(self) -> Path:
        """What the controller needs to reach its agents: its certificate and key, and the link's authority."""
        return self.root / "controller"

    @property
    def link_ca_key(self) -> Path:
        return self.root / "ca" / "agent-link-ca-key.pem"

    @property
    def issued_controllers(self) -> Path:
        """The names of the further controllers `vipu-certs controller` issued certificates to, one per line."""
        return self.root / "ca" / "issued-controllers"

    @property
    def agent_cert(self) -> Path:
        return self.agents_dir / AGENT_CERT

    @property
    def agent_key(self) -> Path:
        return self.agents_dir / AGENT_KEY

    @property
    def controller_cert(self) -> Path:
        return self.controller_dir / CONTROLLER_CERT

    @property
    def controller_key(self) -> Path:
        return self.controller_dir / CONTROLLER_KEY

    @property
    def has_agent_link(self) -> bool:
        """Whether the controller has its agent-link certificate: in secure mode it then reaches its
        agents over TLS (and its simulated agents follow it, with the agents' files)."""
        return self.controller_cert.exists()


def default_hosts() -> list[str]:
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()}
    return sorted(n for n in names if n)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vipu"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_authority(common_name: str = "vipu certificate authority", days: int = 3650) -> tuple[bytes, bytes]:
    """A new certificate authority: (key PEM, certificate PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pem_key(key), certificate.public_bytes(serialization.Encoding.PEM)


def issue(authority_key: bytes, authority_cert: bytes, common_name: str, *, server_names: list[str] | None = None,
          not_before: datetime.datetime | None = None, not_after: datetime.datetime | None = None,
          days: int = DEFAULT_DAYS) -> tuple[bytes, bytes]:
    """A certificate signed by the authority: for a server (with `server_names`) or a client."""
    # A key that cannot sign certificates (DH, X25519...) fails in sign(); make_authority's are EC.
    ca_key = typing.cast(CertificateIssuerPrivateKeyTypes, serialization.load_pem_private_key(authority_key, password=None))
    ca_cert = x509.load_pem_x509_certificate(authority_cert)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after or now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if server_names is not None:
        alternatives: list[x509.GeneralName] = []
        for name in server_names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternatives.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return _pem_key(key), builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    write_file(path, data, 0o600 if private else 0o644)


def generate(files: TlsFiles, hosts: list[str], days: int = DEFAULT_DAYS) -> None:
    """Write a new authority, a server and a client certificate, and the agent link's (`generate_agent_link`)
    unless the directory has a controller certificate of the link already (one a site issued to this
    controller with `vipu-certs controller`, which it keeps); refuse to overwrite any."""
    existing = [p for p in (files.ca_cert, files.server_cert, files.client_cert) if p.exists()]
    if existing:
        raise AlreadyExists(f"{existing[0]} already exists; remove {files.root} to make new certificates")
    if not hosts:
        raise InvalidArgument("the server certificate needs at least one host name or address")
    ca_key, ca_cert = make_authority()
    server_key, server_cert = issue(ca_key, ca_cert, "vipu-server", server_names=hosts, days=days)
    client_key, client_cert = issue(ca_key, ca_cert, "vipu-client", days=days)
    _write(files.ca_key, ca_key, private=True)
    _write(files.ca_cert, ca_cert)
    _write_holder(files.ca_for(files.server_dir), ca_cert, files.server_key, server_key, files.server_cert, server_cert)
    _write_holder(files.ca_for(files.client_dir), ca_cert, files.client_key, client_key, files.client_cert, client_cert)
    if not files.controller_cert.exists():
        generate_agent_link(files, hosts, days)


def generate_agent_link(files: TlsFiles, hosts: list[str], days: int = DEFAULT_DAYS) -> None:
    """The controller-agent link's own authority, a certificate for the agents (for `hosts`) and
    one for the controller; refuse to overwrite any."""
    if files.agent_cert.exists() or files.controller_cert.exists():
        raise AlreadyExists(f"{files.agent_cert} already exists; remove {files.agents_dir} and {files.controller_dir} first")
    link_key, link_cert = make_authority("vipu agent link authority")
    agent_key, agent_cert = issue(link_key, link_cert, "vipu-agent", server_names=hosts, days=days)
    controller_key, controller_cert = issue(link_key, link_cert, "vipu-controller", days=days)
    _write(files.link_ca_key, link_key, private=True)
    _write_holder(files.ca_for(files.agents_dir), link_cert, files.agent_key, agent_key, files.agent_cert, agent_cert)
    _write_holder(files.ca_for(files.controller_dir), link_cert, files.controller_key, controller_key, files.controller_cert,
                  controller_cert)


def issue_link_certificate(files: TlsFiles, name: str, out: Path, hosts: list[str] | None = None,
                           days: int = DEFAULT_DAYS) -> list[Path]:
    """Issue one more certificate from the site's agent-link authority into `out`, with the
    authority's certificate beside it: an agent's for `hosts` (agent.pem, agent-key.pem), or, without
    hosts, a controller's named `name` (controller.pem, controller-key.pem), which agents know it by.
    Refuse to overwrite; the paths written."""
    if not files.link_ca_key.exists():
        raise InvalidArgument(f"no agent-link authority key at {files.link_ca_key}: issue from the TLS directory "
                              "vipu-server --tls-init made")
    link_key, link_cert = _read(files.link_ca_key, "agent link authority's key"), link_authority(files.controller_dir)
    cert_name, key_name = (AGENT_CERT, AGENT_KEY) if hosts is not None else (CONTROLLER_CERT, CONTROLLER_KEY)
    paths = [out / cert_name, out / key_name, files.ca_for(out)]
    existing = [p for p in paths[:2] if p.exists()]
    if existing:
        raise AlreadyExists(f"{existing[0]} already exists")
    if hosts is not None and not hosts:
        raise InvalidArgument("an agent's certificate needs at least one host name or address")
    if paths[2].exists() and paths[2].read_bytes() != link_cert:
        raise AlreadyExists(f"{paths[2]} holds another authority's certificate; name another directory")
    if hosts is None:
        taken = [common_name(files.controller_cert, "controller certificate")] if files.controller_cert.exists() else []
        if files.issued_controllers.exists():
            taken += files.issued_controllers.read_text().split()
        if name in taken:  # two controllers of one name would command each other's machines
            raise AlreadyExists(f"a controller named {name} has a certificate of this site already; name another")
    key, cert = issue(link_key, link_cert, name, server_names=hosts, days=days)
    _write_holder(paths[2], link_cert, paths[1], key, paths[0], cert)
    if hosts is None:
        with open(files.issued_controllers, "a") as issued:
            issued.write(name + "\n")
    return paths


def _write_holder(ca_path: Path, ca: bytes, key_path: Path, key: bytes, cert_path: Path, cert: bytes) -> None:
    """What one holder of a certificate needs in its directory: the authority, its key (owner only), its certificate."""
    _write(ca_path, ca)
    _write(key_path, key, private=True)
    _write(cert_path, cert)


def agent_server_credentials(agents_dir: Path) -> grpc.ServerCredentials:
    """An agent's end-point: it answers only a client with a certificate from the link's authority,
    which only the site's controllers hold."""
    return _mutual_server_credentials(agents_dir / AGENT_KEY, agents_dir / AGENT_CERT, agents_dir / "ca.pem", "agent")


def link_authority(directory: Path) -> bytes:
    """The agent link's authority certificate (PEM) from an agent's or the controller's directory."""
    return _read(directory / "ca.pem", "agent link's certificate authority")


def common_name(path: Path, what: str) -> str:
    """The name a certificate was issued to: on the agent link, a controller's identity."""
    names = x509.load_pem_x509_certificate(_read(path, what)).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def takeover_grant(files: TlsFiles, machine_serial: str) -> str:
    """A grant for this controller to take a machine from the controller holding it, signed with the
    site's agent-link authority key, which a controller made by --tls-init holds and a tenant's does not."""
    if not files.link_ca_key.exists():
        raise PermissionDenied(f"this controller does not hold the site's agent-link authority key ({files.link_ca_key}), "
                               "which a takeover needs")
    return grants.sign(_read(files.link_ca_key, "agent link authority's key"), link_authority(files.controller_dir),
                       machine_serial, common_name(files.controller_cert, "controller's agent-link certificate"))


def agent_channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """The controller's side of the agent link, checked as any client's certificate is."""
    return client_credentials(files.ca_for(files.controller_dir), files.controller_cert, files.controller_key)


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise InvalidArgument(f"cannot read the {what} {path}: {error.strerror}") from error


def forwarding_proof(files: TlsFiles) -> str:
    """What the controller and its dashboard, both holding the server key, know and clients do not;
    worked out from the key itself, not its file's spelling (PEM's line ends, PKCS#1 or PKCS#8)."""
    try:
        key = serialization.load_pem_private_key(_read(files.server_key, "server key"), password=None)
    except ValueError as error:
        raise InvalidArgument(f"the server key {files.server_key} is not a private key in PEM: {error}") from None
    return credentials.forwarding_proof(key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Credentials for an end-point that only answers clients with a certificate from our authority."""
    return _mutual_server_credentials(files.server_key, files.server_cert, files.ca_for(files.server_dir), "server")


def _mutual_server_credentials(key: Path, cert: Path, authority: Path, what: str) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(_read(key, f"{what} key"), _read(cert, f"{what} certificate"))],
                                       root_certificates=_read(authority, f"{what}'s certificate authority"),
                                       require_client_auth=True)


def check_validity(path: Path, what: str = "client certificate") -> None:
    """Refuse a certificate outside its validity period: the server would close the connection without a reason."""
    certificate = x509.load_pem_x509_certificate(_read(path, what))
    now = datetime.datetime.now(datetime.UTC)
    if certificate.not_valid_after_utc < now:
        raise InvalidArgument(f"the {what} {path} expired on {utc_text(certificate.not_valid_after_utc)}")
    if certificate.not_valid_before_utc > now:
        raise InvalidArgument(f"the {what} {path} is not valid before {utc_text(certificate.not_valid_before_utc)}")


def check_client_pair(client_cert: Path, client_key: Path) -> None:
    """Refuse, with the real reason, a client certificate the server would reject without one: a
    key that is not the certificate's, or a certificate not made for client authentication."""
    certificate = x509.load_pem_x509_certificate(_read(client_cert, "client certificate"))
    try:
        key = serialization.load_pem_private_key(_read(client_key, "client key"), password=None)
    except (ValueError, TypeError) as error:
        raise InvalidArgument(f"the client key {client_key} is not an unencrypted PEM private key ({error})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != \
            certificate.public_key().public_bytes(serialization.Encoding.DER, public):
        raise InvalidArgument(f"the client key {client_key} does not belong to the client certificate {client_cert}")
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return  # no restriction: any use
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        raise InvalidArgument(f"the client certificate {client_cert} is not made for client authentication "
                              "(its extended key usage lacks clientAuth)")


def client_credentials(server_ca: Path, client_cert: Path, client_key: Path) -> grpc.ChannelCredentials:
    check_validity(client_cert)
    check_client_pair(client_cert, client_key)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(server_ca, "server certificate authority"),
        private_key=_read(client_key, "client key"),
        certificate_chain=_read(client_cert, "client certificate"),
    )
