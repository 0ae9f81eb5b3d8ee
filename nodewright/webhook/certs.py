"""Webhook certificates: a private CA and a serving certificate, kept in a Secret, rotated before expiry.

The API server calls the webhook over TLS and verifies it against the `caBundle` of the
Validating/MutatingWebhookConfigurations. The operator therefore:

1. loads the CA and serving certificate from the Secret `<name>` in its namespace (keys `ca.crt`,
   `ca.key`, `tls.crt`, `tls.key`), or creates them (EC P-256; CA valid 5 years, serving cert 1 year)
   when absent, unparsable, missing a required DNS name, or within the renewal window (1/3 of the
   serving cert's lifetime left; the CA is renewed when less than the serving lifetime remains);
2. writes the Secret with create-or-replace on the resourceVersion it read, so two replicas racing
   converge on one pair (the loser re-reads);
3. patches `caBundle` of every webhook entry of our configurations when it differs. During CA
   rotation the bundle carries old and new CA, so in-flight calls with the old serving cert still verify.

Generation functions are pure (time is a parameter); I/O is in `CertManager`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from dataclasses import dataclass
from typing import Any

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nodewright.kube.client import KubeClient, PatchType
from nodewright.kube.resources import (
    MUTATINGWEBHOOKCONFIGURATIONS,
    SECRETS,
    VALIDATINGWEBHOOKCONFIGURATIONS,
    Conflict,
    NotFound,
)

log = structlog.get_logger(__name__)

CA_LIFETIME = dt.timedelta(days=5 * 365)
SERVING_LIFETIME = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertBundle:
    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    previous_ca: bytes = b""  # kept in the caBundle while a rotated CA propagates

    @property
    def ca_bundle(self) -> bytes:
        return self.ca_cert + self.previous_ca


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def generate_ca(now: dt.datetime, *, common_name: str = "nodewright-webhook-ca") -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def generate_serving(
    ca_cert_pem: bytes, ca_key_pem: bytes, *, dns_names: list[str], ip_addresses: list[str], now: dt.datetime
) -> tuple[bytes, bytes]:
    import ipaddress

    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0] if dns_names else ip_addresses[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + SERVING_LIFETIME, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def needs_renewal(
    bundle: CertBundle, *, dns_names: list[str], ip_addresses: list[str], now: dt.datetime
) -> str | None:
    """Why the bundle must be regenerated, or None when it is good."""
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert)
        ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    except ValueError:
        return "unparsable certificate"
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    if cert.not_valid_after_utc - now < lifetime / 3:
        return "serving certificate close to expiry"
    if ca.not_valid_after_utc - now < SERVING_LIFETIME:
        return "CA close to expiry"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = set(san.get_values_for_type(x509.DNSName)) | {
        str(i) for i in san.get_values_for_type(x509.IPAddress)
    }
    if not set(dns_names) | set(ip_addresses) <= have:
        return "serving certificate lacks a required name"
    return None


def new_bundle(
    *, dns_names: list[str], ip_addresses: list[str], now: dt.datetime, old: CertBundle | None = None
) -> CertBundle:
    """A fresh serving cert, reusing the old CA while it has a serving lifetime left."""
    reuse_ca = False
    if old is not None:
        try:
            ca = x509.load_pem_x509_certificate(old.ca_cert)
            reuse_ca = ca.not_valid_after_utc - now >= SERVING_LIFETIME
        except ValueError:
            reuse_ca = False
    if reuse_ca and old is not None:
        ca_cert, ca_key, previous = old.ca_cert, old.ca_key, b""
    else:
        ca_cert, ca_key = generate_ca(now)
        previous = old.ca_cert if old is not None else b""
    cert, key = generate_serving(ca_cert, ca_key, dns_names=dns_names, ip_addresses=ip_addresses, now=now)
    return CertBundle(ca_cert=ca_cert, ca_key=ca_key, cert=cert, key=key, previous_ca=previous)


def service_dns_names(service: str, namespace: str) -> list[str]:
    return [
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
    ]


class CertManager:
    """Keeps the Secret and the webhook configurations' caBundle current (the project's client)."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        secret_name: str,
        dns_names: list[str],
        ip_addresses: list[str] | None = None,
        validating_config: str | None = None,
        mutating_config: str | None = None,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._secret = secret_name
        self._dns = dns_names
        self._ips = ip_addresses or []
        self._validating = validating_config
        self._mutating = mutating_config

    async def ensure(self, now: dt.datetime | None = None) -> CertBundle:
        """Load or create/rotate the bundle, store it, patch the caBundles; return the bundle to serve."""
        now = now or dt.datetime.now(dt.UTC)
        existing, resource_version = await self._stored()
        reason = (
            "absent"
            if existing is None
            else needs_renewal(existing, dns_names=self._dns, ip_addresses=self._ips, now=now)
        )
        bundle = existing
        if reason is not None or bundle is None:
            log.info("generating webhook certificate", reason=reason)
            bundle = new_bundle(dns_names=self._dns, ip_addresses=self._ips, now=now, old=existing)
            try:
                await self._store(bundle, resource_version)
            except Conflict:
                return await self.ensure(now)  # another replica won the race: serve its pair
        await self.patch_ca_bundles(bundle.ca_bundle)
        return bundle

    async def _stored(self) -> tuple[CertBundle | None, str | None]:
        """The bundle in the Secret and the Secret's resourceVersion (None, None: no Secret yet)."""
        try:
            secret = await self._client.get(SECRETS, self._secret, namespace=self._namespace)
        except NotFound:
            return None, None
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        bundle = CertBundle(
            ca_cert=data.get("ca.crt", b""),
            ca_key=data.get("ca.key", b""),
            cert=data.get("tls.crt", b""),
            key=data.get("tls.key", b""),
            previous_ca=data.get("ca-previous.crt", b""),
        )
        return bundle, str((secret.get("metadata") or {}).get("resourceVersion") or "") or None

    async def _store(self, bundle: CertBundle, resource_version: str | None) -> None:
        """Create the Secret, or replace it at `resource_version` (Conflict: someone wrote it meanwhile)."""
        meta: dict[str, Any] = {
            "name": self._secret,
            "namespace": self._namespace,
            "labels": {"app.kubernetes.io/name": "nodewright", "app.kubernetes.io/component": "webhook"},
        }
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {
                k: base64.b64encode(v).decode()
                for k, v in {
                    "ca.crt": bundle.ca_cert,
                    "ca.key": bundle.ca_key,
                    "tls.crt": bundle.cert,
                    "tls.key": bundle.key,
                    "ca-previous.crt": bundle.previous_ca,
                }.items()
            },
        }
        if resource_version is None:
            await self._client.create(SECRETS, body, namespace=self._namespace)
        else:
            await self._client.replace(SECRETS, body, namespace=self._namespace)

    async def patch_ca_bundles(self, ca_bundle: bytes) -> None:
        encoded = base64.b64encode(ca_bundle).decode()
        for name, resource in (
            (self._validating, VALIDATINGWEBHOOKCONFIGURATIONS),
            (self._mutating, MUTATINGWEBHOOKCONFIGURATIONS),
        ):
            if not name:
                continue
            current = await self._client.get(resource, name)
            hooks: list[dict[str, Any]] = list(current.get("webhooks") or [])
            bundles = [(h.get("clientConfig") or {}).get("caBundle") for h in hooks]
            if all(b == encoded for b in bundles):
                continue
            # A JSON patch per index keeps the other fields (and other writers' changes) intact.
            ops = [
                {
                    "op": "replace" if b else "add",
                    "path": f"/webhooks/{i}/clientConfig/caBundle",
                    "value": encoded,
                }
                for i, b in enumerate(bundles)
            ]
            await self._client.patch(resource, name, ops, patch_type=PatchType.JSON_PATCH)
            log.info("patched caBundle", configuration=name)

    async def run(self, on_rotate: Any, *, interval_s: float = 3600.0) -> None:
        """Re-check hourly; call `on_rotate(bundle)` when the serving pair changed."""
        current: bytes | None = None
        while True:
            try:
                bundle = await self.ensure()
                if current is not None and bundle.cert != current:
                    on_rotate(bundle)
                current = bundle.cert
            except Exception:
                log.exception("certificate check failed; retrying")
            await asyncio.sleep(interval_s)
