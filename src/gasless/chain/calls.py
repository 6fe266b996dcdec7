"""Unsigned contract calls built through multiversx-sdk with the repo's ABI files."""

from __future__ import annotations

from typing import Any

from multiversx_sdk import (
    Address,
    SmartContractTransactionsFactory,
    Token,
    TokenTransfer,
    Transaction,
    TransactionsFactoryConfig,
)
from multiversx_sdk.abi import Abi


def contract_call(
    *,
    abi: Abi,
    chain_id: str,
    sender: Address,
    contract: Address,
    function: str,
    arguments: list[Any],
    gas_limit: int,
    nonce: int,
    relayer: Address | None = None,
    payment_token: str | None = None,
    payment_amount: int = 0,
) -> Transaction:
    """An unsigned call of `function` (with an optional fungible ESDT payment); relayer set before signing."""
    factory = SmartContractTransactionsFactory(TransactionsFactoryConfig(chain_id=chain_id), abi=abi)
    transfers = (
        [TokenTransfer(Token(payment_token), payment_amount)] if payment_token and payment_amount else []
    )
    tx = factory.create_transaction_for_execute(
        sender=sender,
        contract=contract,
        function=function,
        gas_limit=gas_limit,
        arguments=arguments,
        token_transfers=transfers,
    )
    tx.nonce = nonce
    if relayer is not None:
        tx.relayer = relayer
    return tx


def function_of(tx: Transaction) -> str:
    """The contract function a call reaches, looking through a token transfer's envelope."""
    if not tx.data:
        return ""
    parts = tx.data.split(b"@")
    head = parts[0].decode("ascii", "replace")
    try:
        if head == "ESDTTransfer" and len(parts) >= 4:  # ESDTTransfer@token@amount@function@args...
            return bytes.fromhex(parts[3].decode("ascii")).decode("ascii", "replace")
        if head == "ESDTNFTTransfer" and len(parts) >= 6:  # ...@token@nonce@amount@destination@function
            return bytes.fromhex(parts[5].decode("ascii")).decode("ascii", "replace")
        if head == "MultiESDTNFTTransfer" and len(parts) >= 3:  # @dest@count@(token@nonce@amount)*@function
            index = 3 + 3 * int(parts[2].decode("ascii"), 16)
            return (
                bytes.fromhex(parts[index].decode("ascii")).decode("ascii", "replace")
                if len(parts) > index
                else ""
            )
    except ValueError:
        return ""
    return head


def transfer_destination(tx: Transaction) -> str:
    """Where a transaction's value goes: the destination named inside an NFT, SFT, Meta-ESDT or multi-token
    transfer (sent to the sender itself, the destination in the data), else the receiver."""
    parts = (tx.data or b"").split(b"@")
    index = {"ESDTNFTTransfer": 4, "MultiESDTNFTTransfer": 1}.get(parts[0].decode("ascii", "replace"))
    if index is not None and len(parts) > index:
        try:
            return Address(bytes.fromhex(parts[index].decode("ascii")), "erd").to_bech32()
        except ValueError:
            pass
    return tx.receiver.to_bech32()
