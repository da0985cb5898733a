"""The fleet's certificate authority: its key and certificate, the broker's server certificate, one
client certificate per account (CN = the account: a board's device id), and the revocation list.

Keys are ECDSA P-256: every TLS stack a board runs (OpenSSL 1.1 on JetPack 5 included) takes
them, and they are made in milliseconds. Everything is written as PEM by the ``cryptography``
package; nothing shells out to ``openssl``.

Validity: a fleet of offline boards cannot renew certificates on a schedule, and a board whose
clock is behind refuses a certificate that is "not yet valid", so every certificate starts a day
before it is made (``BACKDATE``) and lasts ``FleetSpec``'s ``certificates.*_days`` (defaults in
``fleet_file``). A stolen key is answered by revocation (``crl``), not by expiry.
"""
import datetime
import ipaddress
from typing import Iterable, List, Optional, Sequence, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How far before "now" every certificate and CRL starts: boards whose clock lags (no RTC, no
#: network time yet) still accept them.
BACKDATE = datetime.timedelta(days=1)


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM (mosquitto and paho read it without a passphrase)."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def load_key(data: bytes):
    return serialization.load_pem_private_key(data, password=None)


def load_cert(data: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data)


def fingerprint(cert: x509.Certificate) -> str:
    """The certificate's SHA-256 fingerprint, hex (what ``openssl x509 -fingerprint`` prints)."""
    return cert.fingerprint(hashes.SHA256()).hex()


def common_name(cert: x509.Certificate) -> str:
    return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def _name(cn: str, org: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key, days: int,
             now: Optional[datetime.datetime]) -> x509.CertificateBuilder:
    now = now or utcnow()
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def make_ca(fleet: str, days: int, now: Optional[datetime.datetime] = None
            ) -> Tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The fleet's CA: a self-signed certificate that may sign certificates and CRLs only."""
    key = new_key()
    name = _name("streamfl %s CA" % fleet, "streamfl fleet %s" % fleet)
    cert = (_builder(name, name, key.public_key(), days, now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert: x509.Certificate, cn: str, days: int, usage, alt_names: Sequence,
          now: Optional[datetime.datetime]) -> Tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = new_key()
    org = ca_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    builder = (_builder(_name(cn, org), ca_cert.subject, key.public_key(), days, now)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False,
                                            key_agreement=True, key_cert_sign=False, crl_sign=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(alt_names)), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_server(ca_key, ca_cert: x509.Certificate, hosts: Sequence[str], days: int,
                 now: Optional[datetime.datetime] = None):
    """The broker's key and certificate; its subject alternative names are ``hosts`` (a name or an
    address each: what the boards and the coordinator connect to)."""
    return _leaf(ca_key, ca_cert, hosts[0], days, ExtendedKeyUsageOID.SERVER_AUTH,
                 [_general_name(h) for h in hosts], now)


def issue_client(ca_key, ca_cert: x509.Certificate, cn: str, days: int,
                 now: Optional[datetime.datetime] = None):
    """A client key and certificate whose CN is ``cn`` (the account; mosquitto's
    ``use_identity_as_username`` makes it the user name)."""
    return _leaf(ca_key, ca_cert, cn, days, ExtendedKeyUsageOID.CLIENT_AUTH, (), now)


def server_hosts(cert: x509.Certificate) -> List[str]:
    """The names and addresses in a server certificate's subject alternative names."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(v) for v in san.get_values_for_type(x509.DNSName)] + [
        str(v) for v in san.get_values_for_type(x509.IPAddress)]


def make_crl(ca_key, ca_cert: x509.Certificate, revoked: Iterable[Tuple[int, datetime.datetime]],
             days: int, now: Optional[datetime.datetime] = None) -> bytes:
    """The CA's certificate revocation list (PEM) of ``(serial, revoked at)``. mosquitto (OpenSSL)
    refuses every client once the list's next update has passed, so it lasts ``days``."""
    now = now or utcnow()
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
               .last_update(now - BACKDATE).next_update(now + datetime.timedelta(days=days)))
    for serial, when in revoked:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build())
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def crl_serials(data: bytes, ca_cert: x509.Certificate,
                renew_before: datetime.timedelta = datetime.timedelta(0)) -> Optional[set]:
    """The serials a PEM CRL revokes, or None where it is not ``ca_cert``'s, unreadable or within
    ``renew_before`` of its next update (it is then made again)."""
    try:
        crl = x509.load_pem_x509_crl(data)
    except ValueError:
        return None
    next_update = crl.next_update_utc if hasattr(crl, "next_update_utc") else (
        crl.next_update.replace(tzinfo=datetime.timezone.utc) if crl.next_update else None)
    if crl.issuer != ca_cert.subject or not crl.is_signature_valid(ca_cert.public_key()) or (
            next_update is None or next_update < utcnow() + renew_before):
        return None
    return {entry.serial_number for entry in crl}
