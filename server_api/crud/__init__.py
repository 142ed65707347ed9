"""Database reads and writes: queries only; the caller owns the transaction.

Nothing here commits or rolls back, decides a state transition or builds an API response
(server_api/layers_test.py keeps it so). The services own one transaction per use case
(core.db.transaction), so checks that must not race are made inside the same locked
transaction as the writes they guard."""
