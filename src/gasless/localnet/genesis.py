"""localnet's genesis: wallets (owner, relayers per shard, demo users), USDC, and the deployed contracts.

Wallets are PEM files under `<data_dir>/wallets/`, generated once and reused on every start, so the
addresses of a data directory never change. A saved chain (`gasless.localnet.persist`) keeps the genesis
facts it was created with (`genesis_facts`), and resumes only with the same wallets (`resume_genesis`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from multiversx_sdk import Address, AddressComputer, UserPEM, UserSecretKey

from gasless.chain.addresses import NUM_SHARDS, address_of, shard_of_pubkey
from gasless.localnet.chain import LocalChain
from gasless.localnet.contracts.venue import LOCALNET_WEGLD_TOKEN

EGLD_UNIT = 10**18
USDC_UNIT = 10**6
RELAYERS_PER_SHARD = 2
RELAYER_FUNDING_ATTO = 1_000 * EGLD_UNIT
OWNER_FUNDING_ATTO = 100_000 * EGLD_UNIT
OWNER_USDC_MICRO = 10_000_000 * USDC_UNIT
USER_USDC_MICRO = 1_000 * USDC_UNIT
PAIR_USDC_RESERVE = 1_000_000 * USDC_UNIT
PAIR_WEGLD_RESERVE = 50_000 * EGLD_UNIT
WRAPPER_EGLD_RESERVE = 100_000 * EGLD_UNIT


@dataclass
class Wallet:
    name: str
    path: Path
    secret_key: UserSecretKey

    @property
    def address(self) -> Address:
        return address_of(self.secret_key.generate_public_key().buffer)

    @property
    def shard(self) -> int:
        return shard_of_pubkey(self.address.get_public_key())


@dataclass
class Genesis:
    owner: Wallet
    relayers: list[Wallet]
    users: list[Wallet]
    payment_token: str
    wegld_token: str
    contract: Address | None = None
    pair: Address | None = None
    wrapper: Address | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def info(self, chain: LocalChain) -> dict[str, Any]:
        return {
            "chainId": chain.config.chain_id,
            "genesisMs": chain.genesis_ms,
            "roundMs": chain.config.round_ms,
            "numShards": chain.config.num_shards,
            "paymentToken": self.payment_token,
            "wegldToken": self.wegld_token,
            "owner": self.owner.address.to_bech32(),
            "contract": self.contract.to_bech32() if self.contract else None,
            "pair": self.pair.to_bech32() if self.pair else None,
            "wrapper": self.wrapper.to_bech32() if self.wrapper else None,
            "gasTank": self.owner.address.to_bech32(),
            "relayers": [
                {"address": w.address.to_bech32(), "shard": w.shard, "pem": str(w.path)}
                for w in self.relayers
            ],
            "users": [
                {"address": w.address.to_bech32(), "shard": w.shard, "pem": str(w.path)} for w in self.users
            ],
            "ownerPem": str(self.owner.path),
        }


def _key_in_shard(shard: int | None) -> UserSecretKey:
    while True:
        key = UserSecretKey.generate()
        if shard is None or shard_of_pubkey(key.generate_public_key().buffer) == shard:
            return key


def load_or_create_wallet(directory: Path, name: str, shard: int | None = None) -> Wallet:
    """The wallet `<name>.pem` in `directory`, generated (in `shard` when given) on first use."""
    path = directory / f"{name}.pem"
    if path.exists():
        pem = UserPEM.from_file(path)
        return Wallet(name, path, pem.secret_key)
    directory.mkdir(parents=True, exist_ok=True)
    key = _key_in_shard(shard)
    address = address_of(key.generate_public_key().buffer)
    UserPEM(label=address.to_bech32(), secret_key=key).save(path)
    path.chmod(0o600)
    return Wallet(name, path, key)


def create_wallets(wallet_dir: Path) -> tuple[Wallet, list[Wallet], list[Wallet]]:
    owner = load_or_create_wallet(wallet_dir, "owner", shard=1)
    relayers = [
        load_or_create_wallet(wallet_dir, f"relayer-s{shard}-{i}", shard)
        for shard in range(NUM_SHARDS)
        for i in range(RELAYERS_PER_SHARD)
    ]
    users = [load_or_create_wallet(wallet_dir, f"user-s{shard}", shard) for shard in range(NUM_SHARDS)]
    return owner, relayers, users


def apply_genesis(
    chain: LocalChain, wallet_dir: Path, payment_token: str, wegld_token: str = LOCALNET_WEGLD_TOKEN
) -> Genesis:
    """Fund the wallets and deploy the billing contract and the venue (paused billing contract)."""
    owner, relayers, users = create_wallets(wallet_dir)
    world = chain.world
    owner_account = world.get(owner.address.get_public_key())
    owner_account.balance = OWNER_FUNDING_ATTO
    owner_account.esdt[payment_token] = OWNER_USDC_MICRO
    for relayer in relayers:
        world.get(relayer.address.get_public_key()).balance = RELAYER_FUNDING_ATTO
    for user in users:
        world.get(user.address.get_public_key()).esdt[payment_token] = USER_USDC_MICRO

    genesis = Genesis(
        owner=owner, relayers=relayers, users=users, payment_token=payment_token, wegld_token=wegld_token
    )
    deploy_contracts(chain, genesis)
    return genesis


def contract_addresses(chain: LocalChain, owner: Address) -> tuple[Address, Address, Address]:
    """(wrapper, pair, billing contract): the owner's genesis deployments at nonces 0, 1, 2."""
    computer = AddressComputer(chain.config.num_shards)
    wrapper, pair, contract = (
        address_of(computer.compute_contract_address(owner, nonce).get_public_key()) for nonce in range(3)
    )
    return wrapper, pair, contract


def genesis_facts(genesis: Genesis) -> dict[str, Any]:
    """What identifies a genesis beyond the chain itself: tokens, wallets and contract addresses."""
    return {
        "paymentToken": genesis.payment_token,
        "wegldToken": genesis.wegld_token,
        "owner": genesis.owner.address.to_bech32(),
        "relayers": [w.address.to_bech32() for w in genesis.relayers],
        "users": [w.address.to_bech32() for w in genesis.users],
        "contracts": [
            a.to_bech32() if a else None for a in (genesis.contract, genesis.pair, genesis.wrapper)
        ],
    }


def resume_genesis(
    chain: LocalChain, wallet_dir: Path, payment_token: str, wegld_token: str = LOCALNET_WEGLD_TOKEN
) -> Genesis:
    """The genesis of a saved chain, from the wallets of the data directory (nothing is applied)."""
    owner, relayers, users = create_wallets(wallet_dir)
    genesis = Genesis(
        owner=owner, relayers=relayers, users=users, payment_token=payment_token, wegld_token=wegld_token
    )
    genesis.wrapper, genesis.pair, genesis.contract = contract_addresses(chain, owner.address)
    return genesis


def deploy_contracts(chain: LocalChain, genesis: Genesis) -> None:
    """Deploy wrapper, pair and billing contract from the owner at nonces 0, 1, 2 (genesis deployments)."""
    from gasless.localnet.contracts.billing import BillingContract
    from gasless.localnet.contracts.seed import seed_config
    from gasless.localnet.contracts.venue import PairContract, WrapperContract

    owner = genesis.owner.address
    owner_pk = owner.get_public_key()
    wrapper, pair, contract = contract_addresses(chain, owner)
    world = chain.world

    wrapper_account = world.get(wrapper.get_public_key())
    wrapper_account.contract = WrapperContract(owner=owner_pk, wegld_token=genesis.wegld_token)
    wrapper_account.owner = owner_pk
    wrapper_account.balance = WRAPPER_EGLD_RESERVE
    wrapper_account.contract.sync_locked_egld(WRAPPER_EGLD_RESERVE)

    pair_account = world.get(pair.get_public_key())
    pair_account.contract = PairContract(
        owner=owner_pk, first_token=genesis.payment_token, second_token=genesis.wegld_token
    )
    pair_account.owner = owner_pk
    pair_account.esdt[genesis.payment_token] = PAIR_USDC_RESERVE
    pair_account.esdt[genesis.wegld_token] = PAIR_WEGLD_RESERVE
    pair_account.contract.sync_reserves(PAIR_USDC_RESERVE, PAIR_WEGLD_RESERVE)
    wrapper_account.esdt[genesis.wegld_token] = 0

    billing = BillingContract(
        owner=owner_pk,
        payment_token=genesis.payment_token,
        pair=pair.get_public_key(),
        wrapper=wrapper.get_public_key(),
        gas_tank=owner_pk,
        wegld_token=genesis.wegld_token,
    )
    seed_config(billing, chain.genesis_ms)
    billing_account = world.get(contract.get_public_key())
    billing_account.contract = billing
    billing_account.owner = owner_pk
    for relayer in genesis.relayers:
        billing.set_relayer_active(relayer.address.get_public_key(), chain.genesis_ms)
    world.get(owner_pk).nonce = 3
    genesis.contract, genesis.pair, genesis.wrapper = contract, pair, wrapper
