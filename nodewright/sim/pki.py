"""Certificates and kubeconfigs for a throw-away local control plane.

kube-apiserver authenticates clients by TLS client certificates signed by `--client-ca-file`; the user
is the certificate's CN and the groups are its O entries, so an admin identity is simply a certificate
with `O=system:masters` (bound to cluster-admin by the bootstrap RBAC policy). The serving certificate
needs SANs for every name clients dial (127.0.0.1, localhost, the in-cluster `kubernetes.default...`
names). Service-account tokens are signed with a separate key pair (`--service-account-signing-key-file`
/ `--service-account-key-file`). ECDSA P-256 keys are used throughout: generation is instant and every
component accepts them (ES256 for service-account tokens).

One CA signs both the serving certificate and client certificates, which is what envtest and kwokctl
do; nothing here is meant to be trusted beyond one local test run.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)
_SERVING_DNS = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local")  # fmt: skip
# 127.0.0.1, and the `kubernetes` Service address (the first of --service-cluster-ip-range): the one
# in-cluster clients (the kubelets and pods of real nodes) dial.
_SERVING_IPS = ("127.0.0.1", "10.96.0.1")


@dataclass(frozen=True)
class Pki:
    """File locations of the generated material (all PEM)."""

    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_crt(self) -> Path:
        return self.dir / "serving.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "serving.key"

    @property
    def admin_crt(self) -> Path:
        return self.dir / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.dir / "admin.key"

    @property
    def kubelet_client_crt(self) -> Path:
        return self.dir / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.dir / "apiserver-kubelet-client.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _sign(
    *,
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    is_ca: bool,
    usages: list[x509.ObjectIdentifier],
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        # Back-date a little: a clock step between processes must not make a fresh cert "not yet valid".
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not is_ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def generate(directory: Path) -> Pki:
    """Create CA, serving cert, admin client cert and service-account key pair under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)

    ca_key = _new_key()
    ca_name = _name("nodewright-sim-ca")
    ca = _sign(
        subject=ca_name,
        public_key=ca_key.public_key(),
        issuer=ca_name,
        issuer_key=ca_key,
        is_ca=True,
        usages=[],
        sans=[],
    )
    _write(pki.ca_key, _key_pem(ca_key), private=True)
    _write(pki.ca_crt, ca.public_bytes(serialization.Encoding.PEM), private=False)

    serving_key = _new_key()
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in _SERVING_DNS]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in _SERVING_IPS]
    serving = _sign(
        subject=_name("kube-apiserver"),
        public_key=serving_key.public_key(),
        issuer=ca_name,
        issuer_key=ca_key,
        is_ca=False,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    _write(pki.serving_key, _key_pem(serving_key), private=True)
    _write(pki.serving_crt, serving.public_bytes(serialization.Encoding.PEM), private=False)

    issue_client_cert(pki, "admin", user="nodewright-admin", groups=("system:masters",))
    # kube-apiserver's identity towards kubelets (logs, exec): real nodes' kubelets trust this CA.
    issue_client_cert(pki, "apiserver-kubelet-client", user="kube-apiserver-kubelet-client")

    sa_key = _new_key()
    _write(pki.sa_key, _key_pem(sa_key), private=True)
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(pki.sa_pub, sa_pub, private=False)
    return pki


def issue_client_cert(pki: Pki, stem: str, *, user: str, groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Sign a client certificate for `user` in `groups`; returns (cert, key) paths `<stem>.crt/.key`."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"unexpected CA key type in {pki.ca_key}")
    ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    key = _new_key()
    cert = _sign(
        subject=_name(user, groups),
        public_key=key.public_key(),
        issuer=ca.subject,
        issuer_key=ca_key,
        is_ca=False,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        sans=[],
    )
    crt_path, key_path = pki.dir / f"{stem}.crt", pki.dir / f"{stem}.key"
    _write(key_path, _key_pem(key), private=True)
    _write(crt_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return crt_path, key_path


def write_kubeconfig(path: Path, *, server: str, ca_crt: Path, client_crt: Path, client_key: Path) -> Path:
    """Write a self-contained kubeconfig (certificates embedded, so the file can be copied anywhere)."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode("ascii")

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sim", "cluster": {"server": server, "certificate-authority-data": b64(ca_crt)}}
        ],
        "users": [
            {
                "name": "sim-user",
                "user": {"client-certificate-data": b64(client_crt), "client-key-data": b64(client_key)},
            }
        ],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim-user"}}],
        "current-context": "sim",
    }
    _write(path, yaml.safe_dump(config, sort_keys=False).encode(), private=True)
    return path
