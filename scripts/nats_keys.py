#!/usr/bin/env python3
"""Makes NATS NKeys and JWTs for the TLS test server (scripts/services.sh), without `nsc`.

    nats_keys.py DIR

writes into DIR (kept when present): user.nk (a user NKey seed, for nkey_file=) and user.pub,
and an operator/account/user JWT setup: operator.jwt, account.jwt (JetStream enabled),
account.pub, and user.creds (a credentials file as `nsc` writes it, for creds_file=).

NKeys are ed25519 keys in base32 with a type prefix and a CRC16 (XMODEM); JWTs are signed with
the issuer's key, `ed25519-nkey`, as the NATS JWT v2 format describes.
"""
import base64
import binascii
import hashlib
import json
import os
import sys
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization

PREFIX = {"seed": 18 << 3, "operator": 14 << 3, "account": 0, "user": 20 << 3}


def crc16(data: bytes) -> int:
    return binascii.crc_hqx(data, 0)


def b32(data: bytes) -> str:
    return base64.b32encode(data).decode().rstrip("=")


def encode(prefix: int, raw: bytes) -> str:
    body = bytes([prefix]) + raw
    return b32(body + crc16(body).to_bytes(2, "little"))


def encode_seed(kind: str, raw: bytes) -> str:
    p = PREFIX[kind]
    body = bytes([PREFIX["seed"] | (p >> 5), (p & 31) << 3]) + raw
    return b32(body + crc16(body).to_bytes(2, "little"))


class Key:
    def __init__(self, kind):
        self.kind = kind
        self.sk = Ed25519PrivateKey.generate()
        raw = self.sk.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        pub = self.sk.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.seed = encode_seed(kind, raw)
        self.public = encode(PREFIX[kind], pub)


def jwt(issuer: Key, subject: str, name: str, nats: dict) -> str:
    header = {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject, "nats": nats}
    # jti: base32 of the SHA-256 of the claims without it, as nsc computes it.
    claims["jti"] = b32(hashlib.sha256(json.dumps(claims, separators=(",", ":")).encode()).digest())
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d, separators=(",", ":")).encode()).decode().rstrip("=")
    signing = f"{enc(header)}.{enc(claims)}"
    sig = base64.urlsafe_b64encode(issuer.sk.sign(signing.encode())).decode().rstrip("=")
    return f"{signing}.{sig}"


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "user.creds")):
        return
    user = Key("user")
    operator, account, jwt_user = Key("operator"), Key("account"), Key("user")
    system = Key("account")
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                 "wildcards": True, "conn": -1, "leaf": -1,
                 "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    files = {
        "user.nk": user.seed + "\n",
        "user.pub": user.public + "\n",
        "operator.jwt": jwt(operator, operator.public, "outbox-test", {"type": "operator", "version": 2}),
        "account.jwt": jwt(operator, account.public, "OUTBOX",
                           {"type": "account", "version": 2, "limits": unlimited}),
        "account.pub": account.public + "\n",
        # The system account JetStream needs in operator mode.
        "sys.jwt": jwt(operator, system.public, "SYS", {"type": "account", "version": 2}),
        "sys.pub": system.public + "\n",
    }
    user_jwt = jwt(account, jwt_user.public, "relay",
                   {"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1})
    files["user.creds"] = (
        "-----BEGIN NATS USER JWT-----\n" + user_jwt + "\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n" + jwt_user.seed + "\n------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )
    for name, body in files.items():
        path = os.path.join(out, name)
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, 0o600)


if __name__ == "__main__":
    main()
