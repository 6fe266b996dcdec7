"""Ed25519 keys in a PKCS#11 token: which key (`KeyRef`), finding and checking one (an Ed25519 signing key,
sensitive and not extractable, whose public key matches: the token signs once and the signature is
verified), listing, importing a wallet's key and generating one inside the token (docs/keys.md)."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from gasless.chain.addresses import address_of, shard_of_pubkey
from gasless.signer.base import SignerUnavailable
from gasless.signer.pkcs11_library import Pkcs11Refused, Pkcs11Unavailable, signer_failure

if TYPE_CHECKING:
    from pkcs11 import Session

# Ed25519's curve in CKA_EC_PARAMS: the DER OID 1.3.101.112 (RFC 8410), or the PrintableString
# "edwards25519" that PKCS#11 3.0 also allows (some modules take only one of the two).
ED25519_OID = bytes.fromhex("06032b6570")
ED25519_NAME = b"\x13\x0cedwards25519"
ED25519_PARAMS = (ED25519_OID, ED25519_NAME)


class KeyTaken(Pkcs11Refused):
    """The token already holds another key under the label or id asked for."""


@dataclass(frozen=True)
class KeyRef:
    """Which key of the token: by `CKA_LABEL` (`label:NAME`, or just `NAME`) or by `CKA_ID` (`id:HEX`)."""

    label: str | None = None
    key_id: bytes | None = None

    @classmethod
    def parse(cls, text: str) -> KeyRef:
        text = text.strip()
        if text.startswith("id:"):
            digits = text[3:].strip().removeprefix("0x")
            if not digits or not re.fullmatch(r"(?:[0-9a-fA-F]{2})+", digits):
                raise ValueError(f"{text!r}: an id is written id:HEX (an even number of hex digits)")
            return cls(key_id=bytes.fromhex(digits))
        label = text.removeprefix("label:")
        if not label:
            raise ValueError(f"{text!r}: a key is written label:NAME or id:HEX")
        return cls(label=label)

    def attributes(self) -> dict[Any, Any]:
        from pkcs11 import Attribute

        return {Attribute.LABEL: self.label} if self.label is not None else {Attribute.ID: self.key_id}

    def __str__(self) -> str:
        return f"label:{self.label}" if self.label is not None else f"id:{(self.key_id or b'').hex()}"


# Keys -------------------------------------------------------------------------------------------------
def public_key_bytes(point: bytes) -> bytes:
    """An Ed25519 CKA_EC_POINT: the DER OCTET STRING of the 32-byte key (SoftHSM, most modules), or the 32
    bytes themselves (as PKCS#11 3.0 words it)."""
    if len(point) == 34 and point[:2] == b"\x04\x20":
        return point[2:]
    if len(point) == 32:
        return point
    raise ValueError(f"not an Ed25519 public key ({len(point)} bytes)")


@dataclass(frozen=True)
class TokenKey:
    """An Ed25519 key pair found in a token."""

    label: str
    key_id: bytes
    pubkey: bytes
    sensitive: bool
    extractable: bool

    @property
    def address(self) -> str:
        return address_of(self.pubkey).to_bech32()

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.pubkey)


def _objects(session: Session, object_class: Any, ref: KeyRef) -> list[Any]:
    from pkcs11 import Attribute

    return list(session.get_objects({Attribute.CLASS: object_class, **ref.attributes()}))


def private_key(session: Session, ref: KeyRef) -> Any:
    from pkcs11 import ObjectClass

    found = _objects(session, ObjectClass.PRIVATE_KEY, ref)
    if not found:
        raise Pkcs11Unavailable(f"no private key {ref} in the token")
    if len(found) > 1:
        raise Pkcs11Refused(f"{len(found)} private keys match {ref}: name one key")
    return found[0]


def key_pair(session: Session, ref: KeyRef) -> tuple[Any, TokenKey]:
    """The private key object of `ref` and what is known of its pair; Pkcs11Refused for a key that is not
    an Ed25519 signing key held sensitive and unextractable, or a pair that does not match."""
    from pkcs11 import Attribute, KeyType, ObjectClass

    private = private_key(session, ref)
    if private[Attribute.KEY_TYPE] != KeyType.EC_EDWARDS:
        raise Pkcs11Refused(f"{ref} is not an Ed25519 key (CKK_EC_EDWARDS)")
    sensitive, extractable = bool(private[Attribute.SENSITIVE]), bool(private[Attribute.EXTRACTABLE])
    if not sensitive or extractable:
        raise Pkcs11Refused(
            f"{ref} can be read out of the token (CKA_SENSITIVE {sensitive}, CKA_EXTRACTABLE {extractable}): "
            "a key the service signs with must be sensitive and not extractable"
        )
    if not private[Attribute.SIGN]:
        raise Pkcs11Refused(f"{ref} may not sign (CKA_SIGN false)")
    publics = _objects(session, ObjectClass.PUBLIC_KEY, ref)
    if len(publics) != 1:
        raise Pkcs11Refused(f"{len(publics)} public keys match {ref}: the token must hold exactly one")
    try:
        pubkey = public_key_bytes(bytes(publics[0][Attribute.EC_POINT]))
    except ValueError as exc:
        raise Pkcs11Refused(f"{ref}: {exc}") from None
    key = TokenKey(
        label=str(private[Attribute.LABEL]),
        key_id=bytes(private[Attribute.ID]),
        pubkey=pubkey,
        sensitive=sensitive,
        extractable=extractable,
    )
    _prove(private, pubkey, ref)
    return private, key


def _prove(private: Any, pubkey: bytes, ref: KeyRef | str) -> None:
    """One signature by `private`, verified with `pubkey`: the token signs, with the key it says it has."""
    from pkcs11 import Mechanism

    message = b"gasless pkcs11 key check " + os.urandom(16)
    signature = bytes(private.sign(message, mechanism=Mechanism.EDDSA))
    try:
        VerifyKey(pubkey).verify(message, signature)
    except (BadSignatureError, ValueError):
        raise Pkcs11Refused(f"{ref}: its signature does not verify with its public key") from None


def list_keys(session: Session) -> list[TokenKey]:
    """Every Ed25519 key pair of the token (private key objects with a public key of the same id)."""
    from pkcs11 import Attribute, KeyType, ObjectClass

    keys = []
    # Read whole first: a session runs one search at a time.
    privates = list(
        session.get_objects(
            {Attribute.CLASS: ObjectClass.PRIVATE_KEY, Attribute.KEY_TYPE: KeyType.EC_EDWARDS}
        )
    )
    for private in privates:
        key_id, label = bytes(private[Attribute.ID]), str(private[Attribute.LABEL])
        ref = KeyRef(key_id=key_id) if key_id else KeyRef(label=label)
        publics = _objects(session, ObjectClass.PUBLIC_KEY, ref)
        if len(publics) != 1:
            continue
        try:
            pubkey = public_key_bytes(bytes(publics[0][Attribute.EC_POINT]))
        except ValueError:
            continue
        keys.append(
            TokenKey(
                label=label,
                key_id=key_id,
                pubkey=pubkey,
                sensitive=bool(private[Attribute.SENSITIVE]),
                extractable=bool(private[Attribute.EXTRACTABLE]),
            )
        )
    return sorted(keys, key=lambda key: (key.shard, key.label))


@dataclass(frozen=True)
class Imported:
    key: TokenKey
    created: bool  # False: the token already held this very key under that label and id


def key_taken(session: Session, label: str, key_id: bytes) -> bool:
    """The token holds a key object (private or public) labelled `label` or with the id `key_id`."""
    from pkcs11 import ObjectClass

    return any(
        _objects(session, cls, ref)
        for ref in (KeyRef(label=label), KeyRef(key_id=key_id))
        for cls in (ObjectClass.PRIVATE_KEY, ObjectClass.PUBLIC_KEY)
    )


def import_key(session: Session, secret: bytes, *, label: str, key_id: bytes) -> Imported:
    """Create the Ed25519 key pair of `secret` (a 32-byte seed) in the token: the private key sensitive,
    not extractable and only for signing, the public key beside it, both under `label` and `key_id`.
    The token's signature is checked before it counts (else both objects are destroyed). Pkcs11Refused when
    the token already holds another key under that label or id."""
    from pkcs11 import Attribute, KeyType, ObjectClass
    from pkcs11.exceptions import AttributeValueInvalid, PKCS11Error, TemplateInconsistent

    pubkey = bytes(SigningKey(secret).verify_key)
    if key_taken(session, label, key_id):
        try:
            _, key = key_pair(session, KeyRef(key_id=key_id))
        except SignerUnavailable:
            key = None
        if key is not None and key.pubkey == pubkey and key.label == label:
            return Imported(key, created=False)
        raise KeyTaken(
            f"the token already holds another key labelled {label!r} or with id {key_id.hex()}: choose "
            "another --label and --id"
        )
    common = {
        Attribute.KEY_TYPE: KeyType.EC_EDWARDS,
        Attribute.TOKEN: True,
        Attribute.LABEL: label,
        Attribute.ID: key_id,
    }
    created: list[Any] = []
    try:
        for params in ED25519_PARAMS:
            try:
                private = session.create_object(
                    {
                        **common,
                        Attribute.CLASS: ObjectClass.PRIVATE_KEY,
                        Attribute.EC_PARAMS: params,
                        Attribute.VALUE: secret,
                        Attribute.PRIVATE: True,
                        Attribute.SENSITIVE: True,
                        Attribute.EXTRACTABLE: False,
                        Attribute.SIGN: True,
                        Attribute.DECRYPT: False,
                        Attribute.UNWRAP: False,
                        Attribute.DERIVE: False,
                    }
                )
                break
            except (AttributeValueInvalid, TemplateInconsistent):
                if params is ED25519_PARAMS[-1]:
                    raise
        created.append(private)
        created.append(
            session.create_object(
                {
                    **common,
                    Attribute.CLASS: ObjectClass.PUBLIC_KEY,
                    Attribute.EC_PARAMS: params,
                    Attribute.EC_POINT: b"\x04\x20" + pubkey,
                    Attribute.PRIVATE: False,
                    Attribute.VERIFY: True,
                }
            )
        )
        _, key = key_pair(session, KeyRef(key_id=key_id))
        if key.pubkey != pubkey:
            raise Pkcs11Refused("the token holds another public key than the one imported")
    except BaseException as exc:
        for obj in created:
            with contextlib.suppress(PKCS11Error):
                obj.destroy()
        if isinstance(exc, PKCS11Error):
            raise signer_failure(exc, "creating the key in the token") from None
        raise
    return Imported(key, created=True)


def generate_key(session: Session, *, shard: int, label: str, key_id: bytes, attempts: int = 64) -> TokenKey:
    """A new Ed25519 key pair generated inside the token (its private key never existed outside it), whose
    address is in `shard`: pairs in other shards are destroyed and generated again."""
    from pkcs11 import Attribute, KeyType, Mechanism
    from pkcs11.exceptions import AttributeValueInvalid, PKCS11Error, TemplateInconsistent

    private_template = {
        Attribute.PRIVATE: True,
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        Attribute.SIGN: True,
        Attribute.DECRYPT: False,
        Attribute.UNWRAP: False,
        Attribute.DERIVE: False,
    }
    public_template = {Attribute.PRIVATE: False, Attribute.VERIFY: True}
    try:
        for _ in range(attempts):
            for params in ED25519_PARAMS:
                try:
                    public, private = session.create_domain_parameters(
                        KeyType.EC_EDWARDS, {Attribute.EC_PARAMS: params}, local=True
                    ).generate_keypair(
                        mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN,
                        store=True,
                        label=label,
                        id=key_id,
                        public_template=public_template,
                        private_template=private_template,
                    )
                    break
                except (AttributeValueInvalid, TemplateInconsistent):
                    if params is ED25519_PARAMS[-1]:
                        raise
            pubkey = public_key_bytes(bytes(public[Attribute.EC_POINT]))
            if shard_of_pubkey(pubkey) == shard:
                _, key = key_pair(session, KeyRef(key_id=key_id))
                return key
            private.destroy()
            public.destroy()
    except PKCS11Error as exc:
        raise signer_failure(exc, "generating a key in the token") from None
    raise Pkcs11Unavailable(f"no key in shard {shard} after {attempts} key pairs")
