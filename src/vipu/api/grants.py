"""Takeover grants: the site's agent-link authority moves a machine from one controller to another.

An agent obeys the one controller that holds it. A grant names a machine (its serial), the
controller that may take it (the name in its agent-link certificate) and when the grant expires,
signed with the key of the agent link's authority. The agent checks it against the authority
certificate it already trusts for the link, so only whoever holds the site's authority key can
hand a machine over against its holder's will; a tenant's controller, holding only its own
certificate, cannot.

A grant is `<payload>.<signature>`, both base64url; the payload is JSON.
"""

from __future__ import annotations

import base64
import binascii
import json
import time

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from vipu.model.errors import InvalidArgument, PermissionDenied

DEFAULT_SECONDS = 60.0  # long enough to reach the agent; an agent takes each grant once
SIGNATURE = ec.ECDSA(hashes.SHA256())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(authority_key: bytes, authority_cert: bytes, machine_serial: str, holder: str, seconds: float = DEFAULT_SECONDS) -> str:
    """A grant letting `holder` take machine `machine_serial` for the next `seconds`. The key must be
    the authority certificate's: a grant signed by another would only be refused by the agent."""
    try:
        key = serialization.load_pem_private_key(authority_key, password=None)
        certificate = x509.load_pem_x509_certificate(authority_cert)
    except (ValueError, TypeError) as error:
        raise InvalidArgument(f"the agent-link authority's key or certificate is unreadable ({error})") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key().public_bytes(serialization.Encoding.DER, public) != \
            certificate.public_key().public_bytes(serialization.Encoding.DER, public):
        raise InvalidArgument("the agent-link authority's key does not belong to the authority the agents trust")
    payload = json.dumps({"machine": machine_serial, "holder": holder, "expires": time.time() + seconds},
                         sort_keys=True).encode()
    return f"{_b64(payload)}.{_b64(key.sign(payload, SIGNATURE))}"


def check(grant: str, authority_cert: bytes, machine_serial: str, holder: str) -> float:
    """Refuse, saying why, a grant that is not the authority's, not for this machine and holder, or
    expired; else when it expires (time.time())."""
    try:
        payload_text, signature_text = grant.split(".")
        payload, signature = _unb64(payload_text), _unb64(signature_text)
        fields = json.loads(payload)
        granted_machine, granted_holder, expires = str(fields["machine"]), str(fields["holder"]), float(fields["expires"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise PermissionDenied("the takeover grant is malformed") from None
    public_key = x509.load_pem_x509_certificate(authority_cert).public_key()
    try:
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise InvalidSignature
        public_key.verify(signature, payload, SIGNATURE)
    except InvalidSignature:
        raise PermissionDenied("the takeover grant is not signed by this site's agent-link authority") from None
    if granted_machine != machine_serial:
        raise PermissionDenied(f"the takeover grant is for machine {granted_machine[:64]}, not this one ({machine_serial})")
    if granted_holder != holder:
        raise PermissionDenied(f"the takeover grant is for controller {granted_holder[:64]}, not {holder}")
    if expires < time.time():
        raise PermissionDenied("the takeover grant has expired")
    return expires
