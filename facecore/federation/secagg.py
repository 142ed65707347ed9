"""Secure aggregation of fixed-point vectors (Bonawitz et al., CCS 2017), honest-but-curious server.

The protocol's four steps as pure functions, shared by the round server (which routes messages
and unmasks the sum, server_api/services/secure_aggregation.py), the device SDK
(device_sdk/secure_round.py) and the benchmark.

0. Advertise: each device makes two X25519 key pairs, c (to encrypt shares) and s (pairwise masks).
1. Share keys: each device draws a self-mask seed b, splits b and its s secret key t-of-n with
   Shamir, and sends each other device its pair of shares, AES-GCM encrypted under
   HKDF-SHA256(X25519(c_u, c_v)).
2. Masked input: y_u = x_u + PRG(b_u) + Σ_{v>u} PRG(s_uv) − Σ_{v<u} PRG(s_uv)  (mod 2^32), where
   s_uv = HKDF-SHA256(X25519(s_u, s_v)) and PRG is a ChaCha20 keystream.
3. Unmask: every device still there sends, for each device that dropped after step 1, its share of
   that device's s key, and for each device that sent y, its share of b. With t shares the server
   rebuilds those secrets, removes the dropped devices' pairwise masks and the survivors' self
   masks, and gets Σ x_u over the survivors, and nothing else. Fewer than t shares: it aborts.

Fixed point: x is clipped to [−bound, bound] and scaled by `scale`; the sum is exact mod 2^32 as
long as n·bound·scale < 2^31.
"""
from __future__ import annotations

import math
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from facecore.errors import FaceCoreError

PRIME = 2**521 - 1  # a Mersenne prime above every 32-byte secret: Shamir works in GF(PRIME)
SHARE_BYTES = 66
SHARE_CIPHERTEXT_BYTES = 12 + 8 + 2 * SHARE_BYTES + 16  # nonce, sender and recipient, two shares, GCM tag


class SecAggAborted(FaceCoreError):
    """Too few devices are left to rebuild the masks: the round must be dropped, not guessed."""


# ---- primitives ----------------------------------------------------------------------------
def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def agree(private: X25519PrivateKey, public: bytes, purpose: bytes) -> bytes:
    """A 32-byte key both ends derive: HKDF-SHA256 over the X25519 shared secret."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"fedface-secagg/" + purpose).derive(shared)


def prg(seed: bytes, length: int) -> np.ndarray:
    """`length` uint32 words of ChaCha20 keystream from a 32-byte seed."""
    encryptor = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(4 * length)), dtype="<u4")


def split_secret(secret: bytes, n: int, t: int) -> list[tuple[int, int]]:
    """Shamir t-of-n shares (x, y) of a secret of at most 32 bytes."""
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n, got t={t}, n={n}")
    coefficients = [int.from_bytes(secret, "big")] + [secrets.randbelow(PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coefficients):
            y = (y * x + c) % PRIME
        shares.append((x, y))
    return shares


def lagrange_weights(xs: Sequence[int]) -> list[int]:
    """λ_i with f(0) = Σ λ_i f(x_i) in GF(PRIME). The same answering devices rebuild every secret,
    so the server computes these once per round: O(t²) once, then O(t) per secret."""
    weights = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num, den = num * -xj % PRIME, den * (xi - xj) % PRIME
        weights.append(num * pow(den, PRIME - 2, PRIME) % PRIME)
    return weights


def combine_shares(shares: Sequence[tuple[int, int]], t: int, length: int = 32, weights: dict[tuple[int, ...], list[int]] | None = None) -> bytes:
    """The secret from any t distinct shares (Lagrange at 0). `weights`: a cache keyed by the x's."""
    points = sorted({x: y for x, y in shares}.items())[:t]
    if len(points) < t:
        raise SecAggAborted(f"{len(points)} share(s) left, {t} needed to rebuild a mask")
    xs = tuple(x for x, _ in points)
    cache = {} if weights is None else weights
    if xs not in cache:
        cache[xs] = lagrange_weights(xs)
    secret = sum(y * w for (_, y), w in zip(points, cache[xs])) % PRIME
    return secret.to_bytes(length, "big")


def threshold_for(n_members: int, fraction: float) -> int:
    """t = max(2, floor(fraction x n) + 1): more than half of the members (fraction >= 0.5), and
    never one, since the "sum" of one update is that update. Never capped at n: a round with
    fewer than t members cannot run."""
    return max(2, math.floor(fraction * n_members) + 1)


def check_threshold(threshold: int, n_members: int) -> None:
    """A device's own check of the t a server sends: below 2, or at most half of the members,
    a coalition of the server and a minority could rebuild an honest device's masks."""
    if threshold < 2 or 2 * threshold <= n_members or threshold > n_members:
        raise SecAggAborted(f"refusing threshold t={threshold} for {n_members} member(s): need 2 <= t, n/2 < t <= n")


def check_members(adverts: Sequence[Advert], own: Advert) -> None:
    """A device's own check of the member list a server sends: every public key appears once, and
    this device's keys only under its own index. A repeated key would let one member read shares
    meant for another, or make two members' pairwise masks cancel; its own keys elsewhere mean the
    server is replaying this device's advert as another member."""
    keys = [key for advert in adverts for key in (advert.c_public, advert.s_public)]
    if len(set(keys)) != len(keys):
        raise SecAggAborted("refusing a member list in which a public key appears twice")
    mine = {own.c_public, own.s_public}
    elsewhere = [a.index for a in adverts if a.index != own.index and mine & {a.c_public, a.s_public}]
    listed = [a for a in adverts if a.index == own.index]
    if elsewhere or len(listed) != 1 or (listed[0].c_public, listed[0].s_public) != (own.c_public, own.s_public):
        raise SecAggAborted(f"refusing a member list that does not hold this device's keys at its index {own.index} alone")


def check_member_count(n_members: int, selected: object, min_members: int) -> None:
    """A device's check of how many members a round has: no more than the devices the server says it
    selected (the count its admin API and /ui show), and at least the device owner's own floor. A
    server that fills a round with puppet members must then also show them as selected devices, and a
    floor above 2 makes each round cost it that many puppets."""
    if isinstance(selected, bool) or not isinstance(selected, int) or not n_members <= selected:
        raise SecAggAborted(f"refusing a member list of {n_members}: the server publishes {str(selected)[:20]} selected devices")
    if n_members < min_members:
        raise SecAggAborted(f"refusing a round of {n_members} members: this device takes part only with at least {min_members}")


def is_valid_public_key(raw: bytes) -> bool:
    """False for anything that is not a usable X25519 public key: wrong length, or a low-order
    point, whose shared secret is all zeros (RFC 7748 section 6.1) and which `cryptography` refuses."""
    if len(raw) != 32:
        return False
    try:
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(raw))
    except ValueError:
        return False
    return True


def mask_bound(n_devices: int, scale: float) -> float:
    """The largest |x| each of n devices may send so that the sum of n quantized inputs stays
    inside int32: one unit of headroom per device for rounding."""
    if n_devices < 1 or scale <= 0:
        raise ValueError(f"need n_devices >= 1 and scale > 0, got {n_devices}, {scale}")
    return ((2**31 - 1) // n_devices - 1) / scale


def float_keys(weights: Mapping[str, np.ndarray]) -> list[str]:
    """The entries that travel masked, in the model's own order: every floating tensor. Integer
    buffers (BatchNorm's step counter) carry no learning and are not aggregated under SecAgg."""
    return [k for k, v in weights.items() if np.asarray(v).dtype.kind == "f"]


def pack(weights: Mapping[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """One float64 vector of `keys`' tensors, concatenated in order."""
    return np.concatenate([np.asarray(weights[k], np.float64).ravel() for k in keys]) if keys else np.zeros(0)


def unpack(vector: np.ndarray, like: Mapping[str, np.ndarray], keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The inverse of pack, shaped like `like`'s tensors."""
    out, offset = {}, 0
    for k in keys:
        shape = np.shape(like[k])
        size = int(np.prod(shape))
        out[k] = vector[offset : offset + size].reshape(shape)
        offset += size
    if offset != vector.size:
        raise ValueError(f"vector has {vector.size} values, the model's float tensors {offset}")
    return out


def weighted_update(delta: Mapping[str, np.ndarray], n_samples: int, max_norm: float = math.inf) -> np.ndarray:
    """What a device masks in FedAvg: n_samples x its delta over the float tensors, the delta first
    clipped to L2 norm `max_norm` (the round's bound, which the server checks the sum against). The
    server divides the unmasked sum by the sum of the n_samples the devices sent in the clear."""
    vector = pack(delta, float_keys(delta))
    length = float(np.linalg.norm(vector))
    if length > max_norm:
        vector = vector * (max_norm / length)
    return vector * float(n_samples)


def quantize(x: np.ndarray, bound: float, scale: float) -> np.ndarray:
    return np.round(np.clip(np.asarray(x, np.float64), -bound, bound) * scale).astype(np.int64).astype(np.uint32)


def dequantize(total: np.ndarray, scale: float) -> np.ndarray:
    return total.astype(np.uint32).view(np.int32).astype(np.float64) / scale


# ---- one device ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Advert:
    index: int  # 1..n, also the device's Shamir x coordinate
    c_public: bytes
    s_public: bytes


class SecAggClient:
    """One device's secrets and steps. On a live server `index` and `threshold` are only known
    after the advertise step closes: the SDK creates the client with 0s and assigns them then."""

    def __init__(self, index: int, threshold: int) -> None:
        self.index, self.threshold = index, threshold
        self._c, self._s = X25519PrivateKey.generate(), X25519PrivateKey.generate()
        self._b = os.urandom(32)
        # sender -> ((x, share of its s key), (x, share of its b)), x being this device's index
        self._received: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}

    def advertise(self) -> Advert:
        return Advert(self.index, _raw(self._c.public_key()), _raw(self._s.public_key()))

    def share_keys(self, adverts: Mapping[int, Advert]) -> dict[int, bytes]:
        """Encrypted (s-key share, b share) for every other device, keyed by recipient."""
        if len(adverts) < self.threshold:
            raise SecAggAborted(f"{len(adverts)} devices advertised keys, threshold is {self.threshold}")
        self._adverts = dict(adverts)
        s_raw = self._s.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
        n = max(adverts)
        s_shares = dict(split_secret(s_raw, n, self.threshold))
        b_shares = dict(split_secret(self._b, n, self.threshold))
        self._received[self.index] = ((self.index, s_shares[self.index]), (self.index, b_shares[self.index]))
        out = {}
        for v, advert in adverts.items():
            if v == self.index:
                continue
            key = agree(self._c, advert.c_public, b"shares")
            plain = self.index.to_bytes(4, "big") + v.to_bytes(4, "big") + s_shares[v].to_bytes(SHARE_BYTES, "big") + b_shares[v].to_bytes(SHARE_BYTES, "big")
            nonce = os.urandom(12)
            out[v] = nonce + AESGCM(key).encrypt(nonce, plain, b"fedface-secagg")
        return out

    def receive_shares(self, ciphertexts: Mapping[int, bytes]) -> None:
        for u, blob in ciphertexts.items():
            key = agree(self._c, self._adverts[u].c_public, b"shares")
            plain = AESGCM(key).decrypt(blob[:12], blob[12:], b"fedface-secagg")
            sender, recipient = int.from_bytes(plain[:4], "big"), int.from_bytes(plain[4:8], "big")
            if (sender, recipient) != (u, self.index):
                raise FaceCoreError(f"share from {sender} for {recipient} arrived as {u} -> {self.index}")
            s_share, b_share = int.from_bytes(plain[8 : 8 + SHARE_BYTES], "big"), int.from_bytes(plain[8 + SHARE_BYTES :], "big")
            self._received[u] = ((self.index, s_share), (self.index, b_share))

    def masked_input(self, quantized: np.ndarray, survivors_of_step_1: Sequence[int]) -> np.ndarray:
        """y = x + PRG(b) ± PRG(s_uv) over the devices that shared keys, mod 2^32."""
        y = quantized.astype(np.uint32) + prg(self._b, quantized.size)
        for v in survivors_of_step_1:
            if v == self.index:
                continue
            mask = prg(agree(self._s, self._adverts[v].s_public, b"pair"), quantized.size)
            y = y + mask if self.index < v else y - mask
        return y

    def unmask_shares(self, dropped: Sequence[int], survived: Sequence[int]) -> dict[str, dict[int, tuple[int, int]]]:
        """Shares of the dropped devices' s keys and of the survivors' b seeds; never both for one device."""
        if set(dropped) & set(survived):
            raise FaceCoreError("a device cannot be both dropped and surviving: refusing to reveal both of its secrets")
        if len(survived) < self.threshold:
            raise SecAggAborted(f"only {len(survived)} device(s) sent masked inputs, threshold is {self.threshold}: refusing to unmask")
        return {
            "s": {v: self._received[v][0] for v in dropped if v in self._received},
            "b": {v: self._received[v][1] for v in survived if v in self._received},
        }


def key_in_process(clients: Mapping[int, SecAggClient]) -> dict[int, Advert]:
    """Steps 0 and 1 for devices that live in one process (tests, benchmarks): every advert to
    everyone, every share bundle routed to its recipient. Returns the adverts."""
    adverts = {i: c.advertise() for i, c in clients.items()}
    inbox: dict[int, dict[int, bytes]] = {i: {} for i in clients}
    for u, client in clients.items():
        for v, blob in client.share_keys(adverts).items():
            inbox[v][u] = blob
    for v, client in clients.items():
        client.receive_shares(inbox[v])
    return adverts


# ---- the server ----------------------------------------------------------------------------
def unmask_sum(
    masked: Mapping[int, np.ndarray], adverts: Mapping[int, Advert], key_sharers: Sequence[int],
    shares: Sequence[Mapping[str, Mapping[int, tuple[int, int]]]], threshold: int,
) -> np.ndarray:
    """Σ x_u (mod 2^32) over the devices in `masked`, from their masked inputs and the step-3 shares."""
    total = np.zeros(next(iter(masked.values())).size, np.uint32)
    for y in masked.values():
        total += y
    return unmask_total(total, list(masked), adverts, key_sharers, shares, threshold)


def unmask_total(
    total: np.ndarray, senders: Sequence[int], adverts: Mapping[int, Advert], key_sharers: Sequence[int],
    shares: Sequence[Mapping[str, Mapping[int, tuple[int, int]]]], threshold: int,
) -> np.ndarray:
    """Σ x_u from Σ y_u (mod 2^32) over `senders`: the server streams the masked inputs into one
    running sum, so its memory does not grow with the number of devices."""
    if len(shares) < threshold:
        raise SecAggAborted(f"{len(shares)} device(s) answered the unmasking step, threshold is {threshold}")
    total = np.array(total, dtype=np.uint32, copy=True)
    weights: dict[tuple[int, ...], list[int]] = {}
    for u in senders:  # remove self masks
        b = combine_shares([answer["b"][u] for answer in shares if u in answer["b"]], threshold, weights=weights)
        total -= prg(b, total.size)
    sent = set(senders)
    for v in (v for v in key_sharers if v not in sent):  # dropped after sharing keys: remove its pairwise masks
        raw = combine_shares([answer["s"][v] for answer in shares if v in answer["s"]], threshold, weights=weights)
        s_v = X25519PrivateKey.from_private_bytes(raw)
        for u in senders:
            mask = prg(agree(s_v, adverts[u].s_public, b"pair"), total.size)
            # u added +mask if u < v, else -mask
            total = total - mask if u < v else total + mask
    return total
